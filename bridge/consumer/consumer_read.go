package consumer

// The consumer's read path: what goes out next (a redelivery, the start list, the
// read-ahead, the tail cache, PostgreSQL), and the read-ahead and its background prefetch.

import (
	"context"
	"errors"

	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/pg"
)

// nextResult says why next stopped.
type nextResult uint8

const (
	nextFound   nextResult = iota
	nextEmpty              // nothing left: the end of the stream for no-wait requests
	nextStalled            // max_ack_pending holds new messages back
	nextFailed             // a read failed; it is retried shortly
)

// next finds the next message to deliver without consuming it: a redelivery first (lowest
// sequence), then, unless max_ack_pending holds new messages back, the next new one from
// the read-ahead, the tail cache, or PostgreSQL.
func (c *consumer) next(ctx context.Context) (m pg.Message, dc uint64, src source, res nextResult) {
	for {
		seq, dc, ok := c.st.Redelivery()
		if !ok {
			break
		}
		m, live, err := c.load(ctx, seq)
		if err != nil {
			return m, 0, 0, nextFailed
		}
		if !live {
			if c.st.Gone(seq) {
				c.floorMoved()
			}
			continue
		}
		return m, dc, srcRedelivery, nextFound
	}
	if c.st.AtMaxAckPending() {
		return m, 0, 0, nextStalled
	}
	for c.start != nil {
		seq := c.start.Skip[0]
		m, live, err := c.load(ctx, seq)
		if err != nil {
			return m, 0, 0, nextFailed
		}
		if live {
			return m, 1, srcStart, nextFound
		}
		c.consume(srcStart)
	}
	for {
		from := c.st.Next()
		hw := c.sc.s.Tail().HighWater()
		if from > hw {
			return m, 0, 0, nextEmpty
		}
		if len(c.ahead) > 0 {
			return c.ahead[0], 1, srcAhead, nextFound
		}
		if c.takePrefetch(ctx) {
			continue
		}
		if c.aheadUpTo >= from {
			if c.st.Skip(c.aheadUpTo + 1) {
				c.floorMoved()
			}
			continue
		}
		m, through, found, hit := c.sc.s.Tail().Next(from, c.matchFilters)
		if hit {
			c.tally.tailHits++
			if found {
				return m, 1, srcTail, nextFound
			}
			if c.st.Skip(through + 1) {
				c.floorMoved()
			}
			continue
		}
		c.cs.m.TailMisses.Inc()
		if !c.readAhead(ctx, from, hw) {
			return m, 0, 0, nextFailed
		}
	}
}

// consume takes a delivered candidate off where it came from.
func (c *consumer) consume(src source) {
	switch src {
	case srcStart:
		c.start.Skip = c.start.Skip[1:]
		if len(c.start.Skip) == 0 {
			if c.st.Skip(c.start.Resume + 1) {
				c.floorMoved()
			}
			c.start = nil
		}
	case srcAhead:
		c.ahead = c.ahead[1:]
		if len(c.ahead) == 0 {
			c.ahead = nil
		}
	}
}

// readAhead reads the next batch for a consumer behind the tail cache: pop lane permit
// first, then a connection, and neither is held once it returns. mu is released meanwhile;
// only this goroutine changes the state, so nothing moves under it.
func (c *consumer) readAhead(ctx context.Context, from, hw uint64) bool {
	if c.cs.clock.Now().Before(c.retryAt) {
		return false
	}
	n := c.out.readSize()
	filters := c.filters()
	upTo := c.behindTail(from, hw)
	c.unlocked = true
	c.mu.Unlock()
	msgs, through, err := c.readShared(ctx, pg.ReadParams{StreamID: c.sc.s.ID(), From: from, UpTo: upTo, MaxMsgs: n, MaxBytes: readAheadBytes}, filters)
	c.mu.Lock()
	if err != nil {
		if ctx.Err() == nil {
			c.cs.warnRead.Warn(c.cs.log, c.cs.clock.Now(), "consumer read failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
		}
		c.retryAt = c.cs.clock.Now().Add(readRetry)
		return false
	}
	c.dropAhead()
	c.ahead, c.aheadUpTo = msgs, through
	return true
}

// behindTail is where a read of PostgreSQL from from should stop: before the tail cache
// starts, when from is behind it, since the consumer continues from the cache there.
func (c *consumer) behindTail(from, hw uint64) uint64 {
	if start := c.sc.s.Tail().Start(); start > from {
		return min(hw, start-1)
	}
	return hw
}

// readShared reads through the stream's shared reads: a read in flight from the same
// position with the same filters is joined rather than made again.
func (c *consumer) readShared(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, error) {
	msgs, through, joined, err := c.sc.reads.Read(ctx, p, filters, c.cs.ReadPop)
	if joined {
		c.cs.m.ReadsShared.Inc()
	}
	return msgs, through, err
}

// prefetch is a read of the batch after the read-ahead, made in the background.
type prefetch struct {
	gen  uint64 // the consumer's aheadGen when it started
	from uint64
	done chan struct{} // closed once msgs, through and err are set

	msgs    []pg.Message
	through uint64
	err     error
}

// prefetch starts reading the next batch in the background when the consumer delivers
// from PostgreSQL and its read-ahead runs low; a consumer that keeps up with the tail
// cache, or waits at the head of the stream, never does. Called with mu held.
func (c *consumer) prefetch(ctx context.Context) {
	if c.pf != nil || len(c.ahead) > c.out.prefetchLow() || c.aheadUpTo == 0 {
		return
	}
	from, hw := c.aheadUpTo+1, c.sc.s.Tail().HighWater()
	if from < c.st.Next() || from > hw {
		return // delivery moved past the read-ahead, or nothing more is committed
	}
	if c.cs.clock.Now().Before(c.retryAt) {
		return
	}
	if _, _, covered := c.sc.s.Tail().Get(from); covered {
		return
	}
	pf := &prefetch{gen: c.aheadGen, from: from, done: make(chan struct{})}
	c.pf = pf
	p := pg.ReadParams{StreamID: c.sc.s.ID(), From: from, UpTo: c.behindTail(from, hw), MaxMsgs: readAheadMax, MaxBytes: readAheadBytes}
	filters := c.filters()
	if !c.cs.g.Go(func() {
		pf.msgs, pf.through, pf.err = c.readShared(ctx, p, filters)
		close(pf.done)
		c.signal()
	}) {
		pf.err = errStopping
		close(pf.done)
	}
}

// takePrefetch appends the background read to the read-ahead, waiting for it if it is
// still running: the consumer needs it now. It reports whether the read-ahead grew or moved.
// Called with mu held; mu is released while it waits.
func (c *consumer) takePrefetch(ctx context.Context) bool {
	pf := c.pf
	if pf == nil {
		return false
	}
	select {
	case <-pf.done:
	default:
		c.unlocked = true
		c.mu.Unlock()
		select {
		case <-pf.done:
		case <-ctx.Done():
		}
		c.mu.Lock()
		if ctx.Err() != nil {
			return false
		}
	}
	c.pf = nil
	if pf.gen != c.aheadGen || pf.from != c.aheadUpTo+1 {
		return false // thrown away meanwhile
	}
	if pf.err != nil {
		if ctx.Err() == nil {
			c.cs.warnRead.Warn(c.cs.log, c.cs.clock.Now(), "consumer read failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", pf.err)
		}
		c.retryAt = c.cs.clock.Now().Add(readRetry)
		return false
	}
	if len(c.ahead) == 0 {
		// The read's own array, clipped, so that nothing appends into it: copying a batch
		// into a fresh one cost a consumer behind the tail cache a copy of every message.
		c.ahead = pf.msgs
	} else {
		c.ahead = append(c.ahead, pf.msgs...)
	}
	c.aheadUpTo = pf.through
	return true
}

// dropAhead forgets the read-ahead and any background read of what follows it.
func (c *consumer) dropAhead() {
	c.ahead, c.aheadUpTo, c.pf = nil, 0, nil
	c.aheadGen++
}

// load returns the message at seq, from the tail when it holds it. live is false when the
// message no longer exists.
func (c *consumer) load(ctx context.Context, seq uint64) (pg.Message, bool, error) {
	if m, live, covered := c.sc.s.Tail().Get(seq); covered {
		c.cs.m.TailHits.Inc()
		return m, live, nil
	}
	// c.ahead is in sequence order: it is read ORDER BY seq and only ever extended past its end.
	if i := tailcache.SearchSeq(c.ahead, seq); i < len(c.ahead) && c.ahead[i].Seq == seq {
		return c.ahead[i], true, nil
	}
	c.cs.m.TailMisses.Inc()
	if c.cs.clock.Now().Before(c.retryAt) {
		return pg.Message{}, false, errRetryLater
	}
	c.unlocked = true
	c.mu.Unlock()
	msgs, _, err := c.cs.ReadPop(ctx, pg.ReadParams{StreamID: c.sc.s.ID(), From: seq, UpTo: seq, MaxMsgs: 1}, nil)
	c.mu.Lock()
	if err != nil {
		c.retryAt = c.cs.clock.Now().Add(readRetry)
		return pg.Message{}, false, err
	}
	if len(msgs) == 0 {
		return pg.Message{}, false, nil
	}
	return msgs[0], true, nil
}

var errRetryLater = errors.New("bridge: consumer read backing off")
