// Package pending keeps a consumer's num_pending honest between counts in PostgreSQL: what
// commits add before the consumer's goroutine folds it in, which sequences were counted so
// that a row seen twice (by the flush that committed it and by a tick's range read) counts
// once, when removals made the count stale, and how far apart expensive recounts are
// spaced. The consumer engine (bridge/consumer) counts in PostgreSQL and owns the count
// itself; a Tracker tells it what to add and when to count again.
//
// # Locks
//
// Tracker.mu is the only lock, a leaf: nothing is taken while it is held. The engine calls
// a Tracker with its consumer's lock held, and from the commit path without it.
package pending

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetgres/jetgres/pg"
)

// A consumer's num_pending (npc) is counted in PostgreSQL when it starts serving, then kept
// up to date in memory: commits add what matches, deliveries take one off each. Removals are
// not seen that way (a purge, a deleted message, limits evicting or replacing messages the
// consumer had not reached, a new filter), so they mark the count stale and the goroutine
// counts again, in PostgreSQL, before it next delivers.

// recountCheap is the recount time under which a stale count is redone at once, however
// often rows are removed. Above it, recounts are spaced recountSpacing times their own
// duration apart, so a consumer far behind on a stream that evicts at every append spends
// a bounded share of the database counting its backlog; deliveries in between carry the
// count as commits and deliveries moved it.
const (
	recountCheap   = 5 * time.Millisecond
	recountSpacing = 4
)

// AllRows is MarkStale's upTo for a removal that may reach any row.
const AllRows = math.MaxUint64

// Tracker is what commits add to a consumer's count before its goroutine folds it in, and
// whether the count must be redone. through is the last sequence counted: a row seen twice
// counts once, and a recount in PostgreSQL ends where later commits start adding.
type Tracker struct {
	mu sync.Mutex
	n  int64
	// through is written under mu and read without it by the goroutine, which needs it
	// only to tell whether a message it delivers was counted yet.
	through atomic.Uint64
	stale   atomic.Bool // removals may have taken rows the count holds
	// counted is where the last count in PostgreSQL began: rows below it were never in the
	// count, so removing them cannot make it stale.
	counted atomic.Uint64
	// recountAt is when a stale count may be redone, after an expensive recount or a
	// failed one. Only the consumer's goroutine touches it.
	recountAt time.Time
}

// Add counts the rows past through that match, of a commit or a read that covers the
// sequences from msgs[0] on, and reports how many did. gap is true when rows between through
// and the first of msgs were committed by another replica and have not been counted: the
// caller must recount in PostgreSQL.
func (t *Tracker) Add(msgs []pg.Message, from uint64, match func(subject string) bool) (n int64, gap bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	through := t.through.Load()
	gap = from > through+1
	for i := range msgs {
		if msgs[i].Seq > through && match(msgs[i].Subject) {
			n++
		}
	}
	if last := msgs[len(msgs)-1].Seq; last > through {
		t.through.Store(last)
	}
	t.n += n
	return n, gap
}

// Through is the last sequence counted.
func (t *Tracker) Through() uint64 { return t.through.Load() }

// Claim is for a first delivery of seq that no commit has counted yet: the goroutine can
// see a commit's rows (in the tail, in a range read) before the commit counts them. It
// returns what commits added meanwhile and moves through to seq, so that the commit that
// brings seq does not count it (or any matching row before it, which in stream order was
// delivered already) as still pending. It reports false when seq was counted after all.
func (t *Tracker) Claim(seq uint64) (added int64, uncounted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	added, t.n = t.n, 0
	if seq <= t.through.Load() {
		return added, false
	}
	t.through.Store(seq)
	return added, true
}

// Take returns what was added since the last Take.
func (t *Tracker) Take() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.n
	t.n = 0
	return n
}

// Peek is Take without taking, for metrics.
func (t *Tracker) Peek() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Begin starts tracking after the first count in PostgreSQL, which began at from and
// reached through: commits add from there on.
func (t *Tracker) Begin(from, through uint64) {
	t.counted.Store(from)
	t.through.Store(through)
}

// Counted records that a recount began at from.
func (t *Tracker) Counted(from uint64) { t.counted.Store(from) }

// MarkStale asks for a recount before the next delivery, unless every removed row lies
// below where the last count began: upTo is the highest removed sequence. It reports
// whether it asked, for the caller to wake the goroutine.
func (t *Tracker) MarkStale(upTo uint64) bool {
	if upTo < t.counted.Load() {
		return false
	}
	t.stale.Store(true)
	return true
}

// SetStale asks for a recount whatever was removed: what the count depends on changed.
func (t *Tracker) SetStale() { t.stale.Store(true) }

// Stale reports whether the count waits for a recount.
func (t *Tracker) Stale() bool { return t.stale.Load() }

// RecountDue reports whether a stale count may be redone at now.
func (t *Tracker) RecountDue(now time.Time) bool { return !now.Before(t.recountAt) }

// RecountWake is when a stale count may be redone, zero when it is not stale.
func (t *Tracker) RecountWake() time.Time {
	if !t.stale.Load() {
		return time.Time{}
	}
	return t.recountAt
}

// Restart begins a recount: the count is no longer stale, what commits added is dropped,
// and the sequence the fresh count must reach is returned.
func (t *Tracker) Restart() uint64 {
	t.stale.Store(false)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n = 0
	return t.through.Load()
}

// Recounted spaces the next recount after one that began at start and took took; a
// failed one (err not nil) leaves the count stale until retry.
func (t *Tracker) Recounted(start time.Time, took time.Duration, err error, retry time.Time) {
	t.recountAt = time.Time{}
	if took > recountCheap {
		t.recountAt = start.Add(took * (1 + recountSpacing))
	}
	if err != nil {
		t.stale.Store(true)
		t.recountAt = retry
	}
}
