// Package tailcache owns the tail caches of the bridge: per stream, its newest committed
// messages in memory, so that consumers that keep up are served without PostgreSQL, all
// of them under one shared byte bound.
//
// A Tail's lock is a leaf: nothing is called while it is held but the match function of
// Next, which must not call back into the tail. The shared bound is kept with atomics.
package tailcache

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/jetgres/jetgres/pg"
)

// Budget is the bound shared by every stream's tail. A tail that grows past it evicts
// its own oldest messages, all of them if need be, so the sum stays within it: each tail
// was within it when it last grew, and the others have not grown since.
type Budget struct {
	max     int64
	used    atomic.Int64
	evicted atomic.Int64 // messages evicted because of the shared bound
}

// NewBudget returns a bound of max bytes, to be shared by every stream's tail.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

// Used is the bytes all tails under the bound hold.
func (b *Budget) Used() int64 { return b.used.Load() }

// Evicted is the count of messages evicted below their own tail's bound because of the
// shared one.
func (b *Budget) Evicted() int64 { return b.evicted.Load() }

// Tail is a stream's byte-bounded cache of its newest committed messages. It covers the
// sequence range [from, through]: every live message in that range is in blocks, in order.
// hw, the committed high-water mark this process knows of, may run ahead of through when
// another replica committed; a shared range read then fills the gap. Messages are shared
// read-only with every consumer that reads them.
//
// A tail starts at the first commit it takes or when a reader first needs it, not when
// its stream is loaded: started at the high-water mark of the load, a tail whose first
// reader came much later would have every row committed since read into it by a range read.
type Tail struct {
	mu sync.RWMutex
	// The messages, oldest first, in blocks of tailBlock: the cache grows and shrinks a
	// block at a time, so it never copies what it holds, which one growing array would do
	// on every doubling (7 % of a publish's CPU while a stream's first messages fill it).
	blocks  [][]pg.Message
	head    int // blocks[0][:head] are evicted
	from    uint64
	through uint64
	hw      uint64
	bytes   int
	max     int
	budget  *Budget
	started bool
}

// New returns a stream's tail, bounded by max bytes and by budget. It covers nothing and
// its high-water mark reads 0 until it starts, at its first Add or at StartAfter.
func New(max int, budget *Budget) *Tail {
	return &Tail{max: max, budget: budget, from: 1}
}

// StartAfter starts the tail after the committed high-water mark hw, unless it started
// already: a commit that got there first knows better where the stream is.
func (t *Tail) StartAfter(hw uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started {
		return
	}
	t.started = true
	t.from, t.through, t.hw = hw+1, hw, hw
}

// Started reports whether the tail has started.
func (t *Tail) Started() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.started
}

// HighWater is the last committed sequence known here.
func (t *Tail) HighWater() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.hw
}

const (
	// tailBlock is how many messages a block of a tail holds.
	tailBlock = 1024
	// tailFirstBlock is the capacity a tail's first block starts with.
	tailFirstBlock = 16
)

// Add takes every live message of [from, through], in sequence order, and starts the tail
// if it had not. A range that does not continue the covered one restarts the cache at from,
// since what lies in the gap is not here.
func (t *Tail) Add(msgs []pg.Message, from, through uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.started = true
	if from > t.through+1 {
		t.reset(from)
	}
	added := 0
	for _, m := range msgs {
		if m.Seq <= t.through {
			continue
		}
		if n := len(t.blocks); n == 0 || len(t.blocks[n-1]) == tailBlock {
			// A tail's first block grows from small, so that the many streams that hold a
			// few messages do not hold a block each: only the cached bytes count against
			// the bounds.
			size := tailBlock
			if n == 0 {
				size = tailFirstBlock
			}
			t.blocks = append(t.blocks, make([]pg.Message, 0, size))
		}
		last := &t.blocks[len(t.blocks)-1]
		*last = append(*last, m)
		added += int(m.Size())
		t.through = m.Seq
	}
	t.bytes += added
	used := t.budget.used.Add(int64(added))
	t.through = max(t.through, through)
	t.hw = max(t.hw, t.through)
	// The shared counters are written once per add, not per evicted message: every
	// stream's commits update them.
	var freed, shared int64
	for (t.bytes > t.max || used-freed > t.budget.max) && len(t.blocks) > 0 {
		if t.bytes <= t.max {
			shared++
		}
		first := t.blocks[0]
		m := &first[t.head]
		size := int(m.Size())
		t.bytes -= size
		freed += int64(size)
		t.from = m.Seq + 1
		*m = pg.Message{}
		t.head++
		if t.head == len(first) {
			t.blocks[0] = nil
			t.blocks, t.head = t.blocks[1:], 0
		}
	}
	t.budget.used.Add(-freed)
	t.budget.evicted.Add(shared)
}

// Raise records a high-water mark seen in PostgreSQL. It reports whether it moved.
func (t *Tail) Raise(hw uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if hw <= t.hw {
		return false
	}
	t.hw = hw
	return true
}

// Missing is the range a shared read should fetch, [through+1, hw], if any.
func (t *Tail) Missing() (from, upTo uint64, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.through + 1, t.hw, t.hw > t.through
}

// Start is the first sequence the cache covers: from there on, up to what it has taken,
// every live message is in memory. A consumer behind it reads PostgreSQL only up to Start
// and then continues from the cache, rather than read again rows the cache holds.
func (t *Tail) Start() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.from
}

// Clear drops everything: after a purge or a delete the cached rows may no longer be live.
func (t *Tail) Clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reset(t.hw + 1)
}

// Rewind drops everything and lowers the high-water mark to hw: the database went back to
// an earlier state (a standby promoted without the last commits), whose sequences after hw
// go to other messages than those the tail held.
func (t *Tail) Rewind(hw uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hw = hw
	t.reset(hw + 1)
}

func (t *Tail) reset(from uint64) {
	t.budget.used.Add(-int64(t.bytes))
	t.blocks, t.head, t.bytes, t.from = nil, 0, 0, from
	t.through = from - 1
}

// Next returns the first message with sequence ≥ from that matches, if found, and the
// sequence up to which it looked, so that the caller may skip what did not match. ok is
// false when from is outside what the cache covers: the caller must read PostgreSQL.
func (t *Tail) Next(from uint64, match func(subject string) bool) (m pg.Message, through uint64, found, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if from < t.from || from > t.through {
		return pg.Message{}, 0, false, false
	}
	for b, i := t.locate(from); b < len(t.blocks); b, i = b+1, 0 {
		for _, m := range t.blocks[b][i:] {
			if match(m.Subject) {
				return m, m.Seq, true, true
			}
		}
	}
	return pg.Message{}, t.through, false, true
}

// Get returns the message with sequence seq if the cache holds it. found is false when
// seq is outside the covered range; inside it, a missing message is gone.
func (t *Tail) Get(seq uint64) (m pg.Message, live, covered bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if seq < t.from || seq > t.through {
		return pg.Message{}, false, false
	}
	if b, i := t.locate(seq); b < len(t.blocks) && t.blocks[b][i].Seq == seq {
		return t.blocks[b][i], true, true
	}
	return pg.Message{}, false, true
}

// locate returns the block and index of the first cached message with sequence ≥ seq, or
// len(t.blocks) if there is none.
func (t *Tail) locate(seq uint64) (block, i int) {
	blocks := t.blocks
	// The last block whose first message is at or before seq; every block holds a message.
	b := sort.Search(len(blocks), func(b int) bool { return t.first(b).Seq > seq }) - 1
	if b < 0 {
		return 0, t.head
	}
	lo := 0
	if b == 0 {
		lo = t.head
	}
	i = lo + SearchSeq(blocks[b][lo:], seq)
	if i == len(blocks[b]) {
		return b + 1, 0
	}
	return b, i
}

// first is the oldest cached message of block b.
func (t *Tail) first(b int) *pg.Message {
	if b == 0 {
		return &t.blocks[0][t.head]
	}
	return &t.blocks[b][0]
}

// SearchSeq returns the index of the first of msgs, which are in sequence order, with
// sequence ≥ seq, or len(msgs) if there is none.
func SearchSeq(msgs []pg.Message, seq uint64) int {
	lo, hi := 0, len(msgs)
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		if msgs[h].Seq < seq {
			lo = h + 1
		} else {
			hi = h
		}
	}
	return lo
}
