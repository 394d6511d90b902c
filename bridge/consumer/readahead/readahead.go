// Package readahead keeps a consumer's read-ahead: the messages a consumer behind the tail
// cache has read from PostgreSQL and not delivered yet, and the background reads of what
// follows them, oldest first. Each background read after the first starts where the one
// before it is planned to end, within the span that earlier reads found to fit their count
// and byte limits, so that several reads of one backlog can run at once.
//
// # Locks
//
// It has none. The consumer's goroutine owns a Lookahead under the consumer's lock; a Read's
// result is written by the goroutine that runs it before Done is closed, and read only
// after.
package readahead

import (
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/pg"
)

// SpanMargin is the share of a read's expected span that a read chained behind another one
// looks through: a little short of its limits, so that variations in density and size
// rarely cut it, since a cut read throws away the reads chained behind it.
const SpanMargin = 0.875

// spanEmptyMax bounds the span, in multiples of a read's message limit, that reads finding
// nothing widen it to: each doubles it.
const spanEmptyMax = 64

// Read is a background read of the sequences [From, UpTo], unless its count or byte limit
// cuts it short.
type Read struct {
	gen        uint64 // the buffer's generation when it started
	From, UpTo uint64
	done       chan struct{}

	msgs    []pg.Message
	through uint64
	err     error
}

// NewRead returns a background read of [from, upTo] for the caller to run and Finish,
// outside any Lookahead.
func NewRead(from, upTo uint64) *Read {
	return &Read{From: from, UpTo: upTo, done: make(chan struct{})}
}

// Result is what the read found, through the sequence it looked through, or why it
// failed. Call it once Done is closed.
func (r *Read) Result() ([]pg.Message, uint64, error) { return r.msgs, r.through, r.err }

// Done is closed once the read has finished.
func (r *Read) Done() <-chan struct{} { return r.done }

// Finish records what the read found, through the sequence it looked through, or why it
// failed, and closes Done. Called once, by whoever runs the read.
func (r *Read) Finish(msgs []pg.Message, through uint64, err error) {
	r.msgs, r.through, r.err = msgs, through, err
	close(r.done)
}

// Lookahead is one consumer's read-ahead and its background reads.
type Lookahead struct {
	// Msgs are read and not yet delivered, in sequence order: read ORDER BY seq and only
	// ever extended past their end.
	Msgs []pg.Message
	// UpTo is the sequence the read-ahead looked through; 0 when there is none.
	UpTo uint64

	gen      uint64 // bumped whenever the read-ahead is thrown away
	reads    []*Read
	span     uint64 // sequences a read may look through within its limits; 0 before one
	maxMsgs  int
	maxBytes int
}

// New returns an empty Lookahead whose reads take at most maxMsgs messages and maxBytes bytes.
func New(maxMsgs, maxBytes int) *Lookahead { return &Lookahead{maxMsgs: maxMsgs, maxBytes: maxBytes} }

// Reset replaces the read-ahead with what a read of [from, through] found, forgetting the
// reads in flight.
func (b *Lookahead) Reset(from, through uint64, msgs []pg.Message) {
	b.Drop()
	b.learnSpan(from, through, msgs)
	b.Msgs, b.UpTo = msgs, through
}

// Drop forgets the read-ahead and the reads in flight, whose results are thrown away.
func (b *Lookahead) Drop() {
	b.Msgs, b.UpTo = nil, 0
	b.dropReads()
	b.gen++
}

func (b *Lookahead) dropReads() {
	clear(b.reads)
	b.reads = b.reads[:0]
}

// Pop takes the first message off the read-ahead.
func (b *Lookahead) Pop() {
	b.Msgs = b.Msgs[1:]
	if len(b.Msgs) == 0 {
		b.Msgs = nil
	}
}

// Find returns the message at seq when the read-ahead holds it.
func (b *Lookahead) Find(seq uint64) (pg.Message, bool) {
	if i := tailcache.SearchSeq(b.Msgs, seq); i < len(b.Msgs) && b.Msgs[i].Seq == seq {
		return b.Msgs[i], true
	}
	return pg.Message{}, false
}

// InFlight is how many background reads are in flight.
func (b *Lookahead) InFlight() int { return len(b.reads) }

// Span is how many sequences a read may look through and stay within its limits, as the
// reads so far found; 0 before the first.
func (b *Lookahead) Span() uint64 { return b.span }

// NextFrom is where the next background read starts: after the last one in flight, or
// after the read-ahead.
func (b *Lookahead) NextFrom() uint64 {
	if n := len(b.reads); n > 0 {
		return b.reads[n-1].UpTo + 1
	}
	return b.UpTo + 1
}

// Begin records a background read of [from, upTo] for the caller to run and Finish.
func (b *Lookahead) Begin(from, upTo uint64) *Read {
	r := NewRead(from, upTo)
	r.gen = b.gen
	b.reads = append(b.reads, r)
	return r
}

// Oldest is the oldest background read in flight, nil when there is none.
func (b *Lookahead) Oldest() *Read {
	if len(b.reads) == 0 {
		return nil
	}
	return b.reads[0]
}

// Take appends the oldest background read, which must be done, to the read-ahead and
// reports whether the read-ahead grew or moved. A read thrown away meanwhile, one that
// does not continue the read-ahead (the read before it was cut short), or one that failed
// takes the reads behind it along, since they start where it was planned to end; failed
// is its error when it failed and was not thrown away.
func (b *Lookahead) Take() (ok bool, failed error) {
	r := b.reads[0]
	if r.gen != b.gen || r.From != b.UpTo+1 || r.err != nil {
		b.dropReads()
		if r.gen == b.gen {
			failed = r.err
		}
		return false, failed
	}
	b.reads[0] = nil
	b.reads = b.reads[1:]
	b.learnSpan(r.From, r.through, r.msgs)
	if len(b.Msgs) == 0 {
		// The read's own array, clipped, so that nothing appends into it: copying a batch
		// into a fresh one cost a consumer behind the tail cache a copy of every message.
		b.Msgs = r.msgs
	} else {
		b.Msgs = append(b.Msgs, r.msgs...)
	}
	b.UpTo = r.through
	return true, nil
}

// learnSpan takes from a read of [from, through] that found msgs how many sequences a read
// may look through and stay within its count and byte limits, at the same density of
// matching messages and the same sizes.
func (b *Lookahead) learnSpan(from, through uint64, msgs []pg.Message) {
	if through < from {
		return
	}
	looked := float64(through - from + 1)
	if len(msgs) == 0 {
		b.span = uint64(min(2*looked, float64(b.maxMsgs)*spanEmptyMax))
		return
	}
	size := 0
	for i := range msgs {
		size += int(msgs[i].Size())
	}
	fit := min(float64(b.maxMsgs)/float64(len(msgs)), float64(b.maxBytes)/float64(max(size, 1)))
	b.span = uint64(max(looked*fit*SpanMargin, 1))
}
