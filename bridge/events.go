package bridge

import (
	"context"

	"github.com/jetgres/jetgres/pg"
)

// A stream tells what happens to its messages through events, so that what keeps some of
// them in memory follows without the code that changed them knowing who that is:
// Committed, Purged, Removed and Dropped. The subscribers are fixed when the bridge is
// built, the same for every stream, and each event goes to them in this order:
//
//  1. the get index (the stream's gets.Index);
//  2. the stream's own tail;
//  3. the consumers this process serves (consumerSide).
//
// The order is part of the contract. The get index learns of a commit before the tail
// shows it: a tail high-water mark beyond the last commit it learned of is another
// replica's commit, for which it forgets its entries. The consumers hear of an event after
// the tail took it: woken by a commit, they read its rows there; told of a purge, they
// find the tail cleared. A commit whose limits removed messages is announced as two
// events, one after the other: Purged when the tail held some of them, Removed otherwise,
// then Committed.
//
// Dispatch is a loop of method calls on the goroutine that made the change: no queue, no
// goroutine hop and nothing allocated for the event itself. Every subscriber has taken the
// event before the change is answered (a PubAck, an API response), so that a fetch sent
// on a PubAck sees what the commit removed and added. A stream's flushes announce their
// commits in commit order: it has one flush in flight at most, and the next begins once the
// last has announced its commit. The SQL mover commits on a goroutine of its own, the API
// workers and retention purge and remove on theirs, and the consumers' ticker fills the
// tail with other replicas' commits: all of that may interleave with a flush's events, as
// it did with the changes themselves; each subscriber's locks keep its state whole.
//
// A subscriber takes locks from consumerSide.mu down (see the package doc): a dispatcher
// may hold the admin lock or a retention pass's. Only a purge request's Purged makes one
// read PostgreSQL (the consumers look up where to move), and it is sent with no lock held.

// Committed is one append's commit to a stream.
type Committed struct {
	// First and Last are the stream's first and last sequences after the commit.
	First, Last uint64
	// Stored is what the commit stored, in sequence order, each message now the last of
	// its subject; shared read-only.
	Stored []pg.Message
}

// Purged says that messages went that readers may hold in memory: a purge request, a
// message delete, max_age or lowered limits, retention's tombstones, or a commit's
// limits reaching messages the tail holds.
type Purged struct {
	// Request says a purge request did it, and Subject is the request's filter ("" for
	// every subject): the consumers move as nats-server moves them.
	Request bool
	Subject string
	// First is the stream's first sequence afterwards, when the purger learned it; 0
	// otherwise.
	First uint64
	// ByCommit says a commit's limits did it; that commit's Committed follows, and tells
	// the get index all it must know.
	ByCommit bool
	// Consumed says only what every consumer had done with went: retention of a work
	// queue, whose consumers never share a message. The tail keeps it for them, as they
	// never go back, and only gets, which may ask for any sequence, must not find it
	// there.
	Consumed bool
}

// Removed says that messages went that no reader needs to forget: the stream's first
// sequence moved to First past messages that every consumer had done with, or a commit's
// limits removed messages that the tail does not hold.
type Removed struct {
	First uint64
	// Unread is the highest removed sequence that a consumer may have counted as pending,
	// 0 when none can have: limits remove whatever they must, below First or tombstoned by
	// per-subject limits, while retention removes only what every consumer is done with.
	Unread uint64
}

// Dropped says that the stream was deleted: whatever a subscriber keeps of it goes.
type Dropped struct{}

// subscriber takes a stream's events; see above for the order and what may interleave.
type subscriber interface {
	onCommitted(s *stream, ev Committed)
	onPurged(ctx context.Context, s *stream, ev Purged)
	onRemoved(s *stream, ev Removed)
	onDropped(s *stream, ev Dropped)
}

// commit announces a commit to s: what its limits removed, then what it stored. ctx bounds
// what subscribers do about the removal.
func (s *stream) commit(ctx context.Context, r pg.AppendResult) {
	switch {
	case !r.Removed:
	case s.tailHoldsAny(r.FirstSeq-1, r.Tombstoned):
		s.purge(ctx, Purged{ByCommit: true})
	default:
		s.remove(Removed{First: r.FirstSeq, Unread: removedUpTo(r)})
	}
	ev := Committed{First: r.FirstSeq, Last: r.LastSeq, Stored: r.Stored}
	for _, sub := range s.subscribers {
		sub.onCommitted(s, ev)
	}
}

// purge announces that messages of s went that readers may hold. ctx bounds the reads a
// purge request's subscribers make.
func (s *stream) purge(ctx context.Context, ev Purged) {
	for _, sub := range s.subscribers {
		sub.onPurged(ctx, s, ev)
	}
}

func (s *stream) remove(ev Removed) {
	for _, sub := range s.subscribers {
		sub.onRemoved(s, ev)
	}
}

func (s *stream) drop() {
	for _, sub := range s.subscribers {
		sub.onDropped(s, Dropped{})
	}
}

// tailHoldsAny reports whether the tail covers one of the given sequences, so that it must
// forget what limits just removed. Limits usually remove the oldest messages, long gone
// from the tail, and clearing it for nothing would send every consumer that keeps up back
// to PostgreSQL.
func (s *stream) tailHoldsAny(below uint64, seqs []uint64) bool {
	if _, _, covered := s.tail.Get(below); covered {
		return true
	}
	for _, seq := range seqs {
		if _, _, covered := s.tail.Get(seq); covered {
			return true
		}
	}
	return false
}

// removedUpTo is the highest sequence a commit removed: below its new first sequence, or
// tombstoned.
func removedUpTo(r pg.AppendResult) uint64 {
	upTo := r.FirstSeq - 1
	for _, seq := range r.Tombstoned {
		upTo = max(upTo, seq)
	}
	return upTo
}

// getSubscriber keeps each stream's get index up to date.
type getSubscriber struct{}

func (getSubscriber) onCommitted(s *stream, ev Committed) {
	s.gets.Committed(ev.First, ev.Last, ev.Stored)
}

func (getSubscriber) onPurged(_ context.Context, s *stream, ev Purged) {
	if !ev.ByCommit {
		s.gets.Purged(ev.First)
	}
}

func (getSubscriber) onRemoved(s *stream, ev Removed) { s.gets.Removed(ev.First) }

func (getSubscriber) onDropped(s *stream, _ Dropped) { s.gets.Dropped() }

// tailSubscriber keeps each stream's tail: the stream's own, taking its events between
// the get index and the consumers.
type tailSubscriber struct{}

func (tailSubscriber) onCommitted(s *stream, ev Committed) {
	if n := len(ev.Stored); n > 0 {
		s.tail.Add(ev.Stored, ev.Stored[0].Seq, ev.Stored[n-1].Seq)
	}
}

func (tailSubscriber) onPurged(_ context.Context, s *stream, ev Purged) {
	if !ev.Consumed {
		s.tail.Clear()
	}
}

func (tailSubscriber) onRemoved(*stream, Removed) {}

// onDropped clears the tail, which gives its bytes back to the shared bound.
func (tailSubscriber) onDropped(s *stream, _ Dropped) { s.tail.Clear() }
