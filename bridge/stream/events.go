package stream

import (
	"context"

	"github.com/jetgres/jetgres/pg"
)

// A stream tells what happens to its messages through events, so that what keeps some of
// them in memory follows without the code that changed them knowing who that is:
// Committed, Purged, Removed and Dropped. The subscribers are fixed before the registry
// starts, the same for every stream, and each event goes to them in this order:
//
//  1. the get index (the stream's gets.Index);
//  2. the stream's own tail;
//  3. those given to Registry.Subscribe, in that order (the bridge's consumers).
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
// A dispatcher may hold the admin lock, or a lock of the engine that made the change (a
// retention pass's), and no lock of this package's but adminMu. Only a purge request's Purged makes one
// read PostgreSQL (the consumers look up where to move), and it is sent with no lock held.

// Committed is one append's commit to a stream, or a mirror's batch (Copied).
type Committed struct {
	// From is the first sequence the commit covers: its first stored message's, or one
	// before it when the sequences between were skipped as the commit stored them (a
	// mirror's batch), which no reader missed.
	From uint64
	// First and Last are the stream's first and last sequences after the commit.
	First, Last uint64
	// Stored is what the commit stored, in sequence order, each message now the last of
	// its subject; shared read-only.
	Stored []pg.Message
}

// Purged says that messages went that readers may hold in memory: a purge request, a
// message delete, max_age or lowered limits, retention's tombstones, or a commit's
// limits reaching messages the tail holds. With no field set it also says that what
// readers hold may be wrong in any way: an append transaction whose commit got no answer may
// have stored messages, and removed others, that nobody was told of.
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

// Subscriber takes a stream's events; see above for the order and what may interleave.
type Subscriber interface {
	OnCommitted(s *Stream, ev Committed)
	OnPurged(ctx context.Context, s *Stream, ev Purged)
	OnRemoved(s *Stream, ev Removed)
	OnDropped(s *Stream, ev Dropped)
}

// Commit announces a commit to s: what its limits removed, then what it stored. ctx bounds
// what subscribers do about the removal.
func (s *Stream) Commit(ctx context.Context, r pg.AppendResult) {
	switch {
	case !r.Removed:
	case s.tailHoldsAny(r.FirstSeq-1, r.Tombstoned):
		s.Purge(ctx, Purged{ByCommit: true})
	default:
		s.Remove(Removed{First: r.FirstSeq, Unread: removedUpTo(r)})
	}
	ev := Committed{First: r.FirstSeq, Last: r.LastSeq, Stored: r.Stored}
	if len(r.Stored) > 0 {
		ev.From = r.Stored[0].Seq
	}
	s.committed(ev)
}

func (s *Stream) committed(ev Committed) {
	for _, sub := range s.subscribers {
		sub.OnCommitted(s, ev)
	}
}

// Trimmed announces that limits took the oldest messages of s, those before first, as a
// commit announces what its limits removed: a purge only when the tail holds some of them.
func (s *Stream) Trimmed(ctx context.Context, first uint64) {
	if first > 0 && s.tailHoldsAny(first-1, nil) {
		s.Purge(ctx, Purged{First: first})
		return
	}
	s.Remove(Removed{First: first, Unread: first - 1})
}

// Purge announces that messages of s went that readers may hold. ctx bounds the reads a
// purge request's subscribers make.
func (s *Stream) Purge(ctx context.Context, ev Purged) {
	for _, sub := range s.subscribers {
		sub.OnPurged(ctx, s, ev)
	}
}

// Remove announces that messages of s went that no reader needs to forget.
func (s *Stream) Remove(ev Removed) {
	for _, sub := range s.subscribers {
		sub.OnRemoved(s, ev)
	}
}

// drop announces that s was deleted.
func (s *Stream) drop() {
	for _, sub := range s.subscribers {
		sub.OnDropped(s, Dropped{})
	}
}

// tailHoldsAny reports whether the tail covers one of the given sequences, so that it must
// forget what limits just removed. Limits usually remove the oldest messages, long gone
// from the tail, and clearing it for nothing would send every consumer that keeps up back
// to PostgreSQL.
func (s *Stream) tailHoldsAny(below uint64, seqs []uint64) bool {
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

func (getSubscriber) OnCommitted(s *Stream, ev Committed) {
	s.gets.Committed(ev.First, ev.Last, ev.Stored)
}

func (getSubscriber) OnPurged(_ context.Context, s *Stream, ev Purged) {
	if !ev.ByCommit {
		s.gets.Purged(ev.First)
	}
}

func (getSubscriber) OnRemoved(s *Stream, ev Removed) { s.gets.Removed(ev.First) }

func (getSubscriber) OnDropped(s *Stream, _ Dropped) { s.gets.Dropped() }

// tailSubscriber keeps each stream's tail: the stream's own, taking its events between
// the get index and the consumers.
type tailSubscriber struct{}

func (tailSubscriber) OnCommitted(s *Stream, ev Committed) {
	if n := len(ev.Stored); n > 0 {
		s.tail.Add(ev.Stored, ev.From, ev.Stored[n-1].Seq)
	}
}

func (tailSubscriber) OnPurged(_ context.Context, s *Stream, ev Purged) {
	if !ev.Consumed {
		s.tail.Clear()
	}
}

func (tailSubscriber) OnRemoved(*Stream, Removed) {}

// onDropped clears the tail, which gives its bytes back to the shared bound.
func (tailSubscriber) OnDropped(s *Stream, _ Dropped) { s.tail.Clear() }
