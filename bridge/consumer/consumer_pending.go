package consumer

import (
	"context"

	"github.com/jetgres/jetgres/pg"
)

// A consumer's num_pending (npc) is counted in PostgreSQL when it starts serving, then kept
// up to date in memory as its pending.Tracker says (see bridge/consumer/pending).

// markStale asks for a recount before the next delivery, unless every removed row lies
// below where the last count began: upTo is the highest removed sequence.
func (c *consumer) markStale(upTo uint64) {
	if c.pend.MarkStale(upTo) {
		c.signal()
	}
}

// recountPending counts num_pending afresh if removals made it stale and the spacing allows.
// Called with mu held, which it gives up around the database read; the goroutine is the only
// one that delivers, so the next sequence cannot move meanwhile.
func (c *consumer) recountPending(ctx context.Context) {
	if !c.pend.Stale() {
		return
	}
	clock := c.cs.clock
	if !c.pend.RecountDue(clock.Now()) {
		c.cs.m.RecountsLate.Inc()
		return
	}
	through := c.pend.Restart()
	from, extra := c.countFrom()
	p := pg.PendingParams{StreamID: c.sc.s.ID(), From: from, UpTo: through, Filters: c.filters()}
	c.mu.Unlock()
	start := clock.Now()
	n, err := c.cs.db.CountPending(ctx, p)
	took := clock.Now().Sub(start)
	c.mu.Lock()
	c.pend.Recounted(start, took, err, clock.Now().Add(readRetry))
	if err != nil {
		if ctx.Err() == nil {
			c.cs.warnPending.Warn(c.cs.log, c.cs.clock.Now(), "counting pending messages failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
		}
		return
	}
	c.npc = int64(n + extra)
	c.pend.Counted(c.st.Next())
	c.cs.m.Recounts.Inc()
}

// countFrom is where a count of num_pending in PostgreSQL starts, and what it must add for
// messages before that: a consumer still delivering the last message of each subject has
// those it has not sent yet, then everything after the point it resumes from. A key-value
// watcher learns from this count when it has seen every current value.
func (c *consumer) countFrom() (from, extra uint64) {
	if c.start != nil {
		return c.start.Resume + 1, uint64(len(c.start.Skip))
	}
	return c.st.Next(), 0
}
