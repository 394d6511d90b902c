package consumer

import (
	"context"
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

// pendingCommits is what commits add to a consumer's count before its goroutine folds it in.
// through is the last sequence counted: a row seen twice (by the flush that committed it and
// by a tick's range read) counts once, and a recount in PostgreSQL ends where later commits
// start adding.
type pendingCommits struct {
	mu sync.Mutex
	n  int64
	// through is written under mu and read without it by the goroutine, which needs it
	// only to tell whether a message it delivers was counted yet.
	through atomic.Uint64
}

// add counts the rows past through that match, of a commit or a read that covers the
// sequences from msgs[0] on, and reports how many did. gap is true when rows between through
// and the first of msgs were committed by another replica and have not been counted: the
// caller must recount in PostgreSQL.
func (p *pendingCommits) add(msgs []pg.Message, from uint64, match func(subject string) bool) (n int64, gap bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	through := p.through.Load()
	gap = from > through+1
	for i := range msgs {
		if msgs[i].Seq > through && match(msgs[i].Subject) {
			n++
		}
	}
	if last := msgs[len(msgs)-1].Seq; last > through {
		p.through.Store(last)
	}
	p.n += n
	return n, gap
}

// claim is for a first delivery of seq that no commit has counted yet: the goroutine can
// see a commit's rows (in the tail, in a range read) before the commit counts them. It
// returns what commits added meanwhile and moves through to seq, so that the commit that
// brings seq does not count it (or any matching row before it, which in stream order was
// delivered already) as still pending. It reports false when seq was counted after all.
func (p *pendingCommits) claim(seq uint64) (added int64, uncounted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	added, p.n = p.n, 0
	if seq <= p.through.Load() {
		return added, false
	}
	p.through.Store(seq)
	return added, true
}

// take returns what was added since the last take.
func (p *pendingCommits) take() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.n
	p.n = 0
	return n
}

// peek is take without taking, for metrics.
func (p *pendingCommits) peek() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// restart drops what was added and returns the sequence a fresh count must reach.
func (p *pendingCommits) restart() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = 0
	return p.through.Load()
}

// markStale asks for a recount before the next delivery, unless every removed row lies
// below where the last count began: upTo is the highest removed sequence.
func (c *consumer) markStale(upTo uint64) {
	if upTo < c.counted.Load() {
		return
	}
	c.stale.Store(true)
	c.signal()
}

// allRows is markStale's upTo for a removal that may reach any row.
const allRows = math.MaxUint64

// recountPending counts num_pending afresh if removals made it stale and the spacing allows.
// Called with mu held, which it gives up around the database read; the goroutine is the only
// one that delivers, so the next sequence cannot move meanwhile.
func (c *consumer) recountPending(ctx context.Context) {
	if !c.stale.Load() {
		return
	}
	clock := c.cs.clock
	if clock.Now().Before(c.recountAt) {
		c.cs.m.recountsLate.Inc()
		return
	}
	c.stale.Store(false)
	through := c.pend.restart()
	from, extra := c.countFrom()
	p := pg.PendingParams{StreamID: c.sc.s.ID(), From: from, UpTo: through, Filters: c.filters()}
	c.mu.Unlock()
	start := clock.Now()
	n, err := c.cs.db.CountPending(ctx, p)
	took := clock.Now().Sub(start)
	c.mu.Lock()
	c.recountAt = time.Time{}
	if took > recountCheap {
		c.recountAt = start.Add(took * (1 + recountSpacing))
	}
	if err != nil {
		if ctx.Err() == nil {
			c.cs.warnPending.Warn(c.cs.log, c.cs.clock.Now(), "counting pending messages failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
		}
		c.stale.Store(true)
		c.recountAt = clock.Now().Add(readRetry)
		return
	}
	c.npc = int64(n + extra)
	c.counted.Store(c.st.Next())
	c.cs.m.recounts.Inc()
}

// countFrom is where a count of num_pending in PostgreSQL starts, and what it must add for
// messages before that: a consumer still delivering the last message of each subject has
// those it has not sent yet, then everything after the point it resumes from. A key-value
// watcher learns from this count when it has seen every current value.
func (c *consumer) countFrom() (from, extra uint64) {
	if c.start != nil {
		return c.start.resume + 1, uint64(len(c.start.skip))
	}
	return c.st.Next(), 0
}
