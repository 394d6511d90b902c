// Package startpos decides where a new consumer starts, from its deliver policy and what
// PostgreSQL holds, as nats-server's selectStartingSeqNo does, and where CONSUMER.RESET
// moves one, as its resetStartingSeq does; and keeps, for a consumer that starts with the
// last message of each subject, that list and the batches of it read, the next one in the
// background. It has no locks: a consumer's goroutine owns its Position.
package startpos

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/readahead"
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// PositionStore is what Choose reads; *pg.DB satisfies it.
type PositionStore interface {
	State(ctx context.Context, id int64) (pg.StreamState, error)
	LastBySubject(ctx context.Context, streamID int64, filter string) (*pg.Message, error)
	LastSeqsPerSubject(ctx context.Context, streamID int64, filters []string, upTo uint64) ([]uint64, error)
	SeqAtTime(ctx context.Context, streamID int64, ts int64) (uint64, error)
}

// Position is where a consumer created just now starts.
type Position struct {
	Next uint64
	// Skip is, for deliver last per subject, the messages delivered first; then delivery
	// resumes after Resume.
	Skip   []uint64
	Resume uint64

	// batch holds messages of Skip read from PostgreSQL together, in sequence order, and
	// batchTo the sequence that read looked through: one read per message cost a
	// key-value watcher of 100,000 keys as many round trips, about 30 µs of CPU per key,
	// most of it PostgreSQL's.
	batch   []pg.Message
	batchTo uint64
	// ahead reads the batch after batch in the background while batch is delivered; nil
	// when no such read runs.
	ahead *readahead.Read
}

// FromBatch returns Skip's first message from the batch read: covered is false when the
// batch does not reach it, found false when the batch looked through it and it was not
// there (deleted since the list was made).
func (p *Position) FromBatch() (m pg.Message, found, covered bool) {
	seq := p.Skip[0]
	if seq > p.batchTo {
		return pg.Message{}, false, false
	}
	// Both are in sequence order and Skip is taken from its front: what lies below seq is
	// behind it for good.
	i := tailcache.SearchSeq(p.batch, seq)
	p.batch = p.batch[i:]
	if len(p.batch) > 0 && p.batch[0].Seq == seq {
		return p.batch[0], true, true
	}
	return pg.Message{}, false, true
}

// NextBatch is the range of the next batch to read: from Skip's first sequence through its
// max-th. Every sequence listed matches the consumer's filters; the rows between them that
// are not the last of their subject come along and are passed over.
func (p *Position) NextBatch(max int) (from, upTo uint64) {
	return p.Skip[0], p.Skip[min(len(p.Skip), max)-1]
}

// SetBatch keeps what a read of the next batch found, through the sequence it looked
// through.
func (p *Position) SetBatch(msgs []pg.Message, through uint64) { p.batch, p.batchTo = msgs, through }

// DropBatch forgets the batch read and the read of the one after it, as when the
// consumer's read-ahead is thrown away.
func (p *Position) DropBatch() { p.batch, p.batchTo, p.ahead = nil, 0, nil }

// Following is the range of the batch after the one read, to read in the background while
// that one is delivered: from the first sequence of Skip past it through at most max of
// them. ok is false before a batch was read, when Skip ends within it, or when that read
// runs already.
func (p *Position) Following(max int) (from, upTo uint64, ok bool) {
	if p.ahead != nil || p.batchTo == 0 {
		return 0, 0, false
	}
	i, _ := slices.BinarySearch(p.Skip, p.batchTo+1)
	if i == len(p.Skip) {
		return 0, 0, false
	}
	return p.Skip[i], p.Skip[min(len(p.Skip), i+max)-1], true
}

// SetAhead records r, the background read of the range Following gave.
func (p *Position) SetAhead(r *readahead.Read) { p.ahead = r }

// TakeAhead hands over the background read when it starts at Skip's first sequence, for
// the caller to wait for and keep with SetBatch, and forgets it either way.
func (p *Position) TakeAhead() *readahead.Read {
	r := p.ahead
	p.ahead = nil
	if r == nil || r.From != p.Skip[0] {
		return nil
	}
	return r
}

// Choose decides where a new consumer of the stream streamID with configuration cfg starts.
func Choose(ctx context.Context, db PositionStore, streamID int64, cfg *server.ConsumerConfig) (*Position, error) {
	st, err := db.State(ctx, streamID)
	if err != nil {
		return nil, err
	}
	first, last := st.FirstSeq, st.LastSeq
	filters := jswire.ConsumerFilters(cfg)
	var next uint64
	var pos Position
	switch cfg.DeliverPolicy {
	case server.DeliverAll:
		next = first
	case server.DeliverLast:
		next = last
		if len(filters) > 0 {
			next = 0
			for _, f := range filters {
				m, err := db.LastBySubject(ctx, streamID, f)
				if errors.Is(err, pg.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				next = max(next, m.Seq)
			}
			if next == 0 {
				next = last + 1
			}
		}
	case server.DeliverLastPerSubject:
		seqs, err := db.LastSeqsPerSubject(ctx, streamID, filters, last)
		if err != nil {
			return nil, err
		}
		next = last + 1
		if len(seqs) > 0 {
			next = seqs[0]
			pos.Skip, pos.Resume = seqs, last
		}
	case server.DeliverByStartSequence:
		next = cfg.OptStartSeq
	case server.DeliverByStartTime:
		next, err = db.SeqAtTime(ctx, streamID, cfg.OptStartTime.UnixNano())
		if err != nil {
			return nil, err
		}
	default:
		next = last + 1
	}
	if cfg.OptStartSeq == 0 {
		switch {
		case last == 0:
			next = 1
		case next > last:
			next = last + 1
		}
	}
	pos.Next = max(next, first, 1)
	return &pos, nil
}

// Reset decides where CONSUMER.RESET moves a consumer of the stream streamID with
// configuration cfg, as nats-server's resetStartingSeq does: req 0 is back to just above
// floor, its ack floor's stream sequence, whatever the deliver policy; any other sequence
// only for deliver all, or no lower than the start a by-sequence or by-time consumer was
// given. seq is the reset point the response reports; for deliver last per subject, pos
// delivers the last message of each subject from seq on first. err is nats-server's
// reason, for JSConsumerInvalidResetErr, or PostgreSQL's failure wrapped.
func Reset(ctx context.Context, db PositionStore, streamID int64, cfg *server.ConsumerConfig, floor, req uint64) (seq uint64, pos *Position, err error) {
	seq = req
	switch {
	case req == 0:
		seq = floor + 1
	case cfg.DeliverPolicy == server.DeliverAll:
	case cfg.DeliverPolicy == server.DeliverByStartSequence:
		if req < cfg.OptStartSeq {
			return 0, nil, ErrBelowStartSeq
		}
	case cfg.DeliverPolicy == server.DeliverByStartTime && cfg.OptStartTime != nil:
		from, err := db.SeqAtTime(ctx, streamID, cfg.OptStartTime.UnixNano())
		if err != nil {
			return 0, nil, fmt.Errorf("the sequence at the consumer's start time: %w", err)
		}
		if req < from {
			return 0, nil, ErrBelowStartTime
		}
	default:
		return 0, nil, ErrResetNotAllowed
	}
	pos = &Position{Next: seq}
	if cfg.DeliverPolicy != server.DeliverLastPerSubject {
		return seq, pos, nil
	}
	st, err := db.State(ctx, streamID)
	if err != nil {
		return 0, nil, fmt.Errorf("stream state: %w", err)
	}
	seqs, err := db.LastSeqsPerSubject(ctx, streamID, jswire.ConsumerFilters(cfg), st.LastSeq)
	if err != nil {
		return 0, nil, fmt.Errorf("last messages per subject: %w", err)
	}
	if i, _ := slices.BinarySearch(seqs, seq); i < len(seqs) {
		pos.Next, pos.Skip, pos.Resume = seqs[i], seqs[i:], seqs[len(seqs)-1]
	}
	return seq, pos, nil
}

// The reasons nats-server gives for a reset it refuses, in its words.
var (
	ErrBelowStartSeq   = errors.New("below start seq")
	ErrBelowStartTime  = errors.New("below start time")
	ErrResetNotAllowed = errors.New("not allowed")
)
