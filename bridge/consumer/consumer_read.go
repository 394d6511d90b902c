package consumer

// The consumer's read path: what goes out next (a redelivery, the start list, the
// read-ahead, the tail cache, PostgreSQL), and the read-ahead and its background prefetch.

import (
	"context"
	"errors"
	"time"

	"github.com/jetgres/jetgres/bridge/consumer/readahead"
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
		m, live, err := c.loadStart(ctx)
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
		if len(c.ahead.Msgs) > 0 {
			return c.ahead.Msgs[0], 1, srcAhead, nextFound
		}
		if c.takePrefetch(ctx) {
			continue
		}
		if c.ahead.UpTo >= from {
			if c.st.Skip(c.ahead.UpTo + 1) {
				c.floorMoved()
			}
			continue
		}
		m, through, found, hit := c.sc.s.Tail().Next(from, c.matchFilters)
		if hit {
			c.tally.TailHits++
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
		c.ahead.Pop()
	}
}

// loadStart returns the first message of the start list, from the tail when it holds it,
// otherwise from the list's batch, reading the next batch from PostgreSQL when the one
// read does not reach it. live is false when the message no longer exists. Called with mu
// held; mu is released while it reads.
func (c *consumer) loadStart(ctx context.Context) (pg.Message, bool, error) {
	st := c.start
	if m, live, covered := c.sc.s.Tail().Get(st.Skip[0]); covered {
		c.cs.m.TailHits.Inc()
		return m, live, nil
	}
	if m, found, covered := st.FromBatch(); covered {
		return m, found, nil
	}
	if r := st.TakeAhead(); r != nil && c.awaitRead(ctx, r) {
		if msgs, through, err := r.Result(); err == nil {
			st.SetBatch(msgs, through)
			c.readFollowing(ctx)
			if m, found, covered := st.FromBatch(); covered {
				return m, found, nil
			}
		}
	}
	if c.cs.clock.Now().Before(c.retryAt) {
		return pg.Message{}, false, errRetryLater
	}
	from, upTo := st.NextBatch(readAheadMax)
	c.cs.m.TailMisses.Inc()
	c.unlocked = true
	c.mu.Unlock()
	began := c.cs.clock.Now()
	msgs, through, err := c.readShared(ctx, pg.ReadParams{StreamID: c.sc.s.ID(), From: from, UpTo: upTo, MaxMsgs: readAheadMax, MaxBytes: readAheadBytes}, c.filters())
	c.readWaited(began)
	c.mu.Lock()
	if err != nil {
		c.readFailed(ctx, err)
		return pg.Message{}, false, err
	}
	st.SetBatch(msgs, through)
	c.readFollowing(ctx)
	if m, found, covered := st.FromBatch(); covered {
		return m, found, nil
	}
	return c.load(ctx, st.Skip[0]) // the batch was cut short before its first message
}

// readFollowing starts reading the start list's next batch in the background, so that it
// is there when the batch read runs out: read one after another, the batches of a
// key-value watcher's initial values left it idle for each read. Called with mu held.
func (c *consumer) readFollowing(ctx context.Context) {
	from, upTo, ok := c.start.Following(readAheadMax)
	if !ok {
		return
	}
	if _, _, covered := c.sc.s.Tail().Get(from); covered {
		return
	}
	r := readahead.NewRead(from, upTo)
	if c.goRead(ctx, r) {
		c.start.SetAhead(r)
		c.cs.m.TailMisses.Inc()
	}
}

// goRead runs r, a read of PostgreSQL, on a goroutine of its own, and signals the consumer
// when it finished. It reports whether it started: not once the engine stops.
func (c *consumer) goRead(ctx context.Context, r *readahead.Read) bool {
	p := pg.ReadParams{StreamID: c.sc.s.ID(), From: r.From, UpTo: r.UpTo, MaxMsgs: readAheadMax, MaxBytes: readAheadBytes}
	filters := c.filters()
	return c.cs.g.Go(func() {
		r.Finish(c.readShared(ctx, p, filters))
		c.signal()
	})
}

// awaitRead waits for r to finish, with mu released unless it has, and reports whether it
// did: false when the consumer stops first. Called with mu held.
func (c *consumer) awaitRead(ctx context.Context, r *readahead.Read) bool {
	select {
	case <-r.Done():
		return true
	default:
	}
	c.unlocked = true
	c.mu.Unlock()
	began := c.cs.clock.Now()
	select {
	case <-r.Done():
	case <-ctx.Done():
	}
	c.readWaited(began)
	c.mu.Lock()
	return ctx.Err() == nil
}

// readWaited counts the time since began that the consumer waited for a read.
func (c *consumer) readWaited(began time.Time) {
	c.cs.m.ReadWaitTime.Add(max(c.cs.clock.Now().Sub(began).Seconds(), 0))
}

// readFailed notes a failed read: it is warned of, unless the consumer is stopping, and
// retried after readRetry.
func (c *consumer) readFailed(ctx context.Context, err error) {
	if ctx.Err() == nil {
		c.cs.warnRead.Warn(c.cs.log, c.cs.clock.Now(), "consumer read failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
	}
	c.retryAt = c.cs.clock.Now().Add(readRetry)
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
	began := c.cs.clock.Now()
	msgs, through, err := c.readShared(ctx, pg.ReadParams{StreamID: c.sc.s.ID(), From: from, UpTo: upTo, MaxMsgs: n, MaxBytes: readAheadBytes}, filters)
	c.readWaited(began)
	c.mu.Lock()
	if err != nil {
		c.readFailed(ctx, err)
		return false
	}
	c.dropAhead()
	c.ahead.Reset(from, through, msgs)
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

// pushReadsInFlight is how many background reads a push consumer keeps going while it
// delivers from PostgreSQL. With one, the consumer waited for nearly every read of a
// backlog (90 of 100 reads, 40 % of its time, on a busy machine): a read of a batch took
// longer than sending it, and PostgreSQL sat idle while the consumer sent. The second read
// runs while the first is taken and sent. With two, an ordered consumer draining 200,000
// messages still waited for its reads for about a third of its time, and an object get a
// third to a half; a third read cut those waits by about a fifth to a half in turns run
// side by side (BenchmarkOrderedBacklog, BenchmarkOrderedObjectGet), at the cost of one more
// read's messages held per push consumer behind the tail cache: at most readAheadBytes.
const pushReadsInFlight = 3

// pullReadsInFlight is pushReadsInFlight for a pull consumer. With one, the jetstream
// package's ordered consumer (which pulls batches of 500) draining 200,000 messages waited
// for its reads for 10 to 25 % of its time; with two, in turns side by side, it waited
// about half as long in each of five turns (BenchmarkOrderedConsume). Its requests are
// smaller than a push consumer's flow-control window, so a third read would mostly wait
// for the next request.
const pullReadsInFlight = 2

// prefetch starts reading the next batches in the background when the consumer delivers
// from PostgreSQL and its read-ahead runs low; a consumer that keeps up with the tail
// cache, or waits at the head of the stream, never does. A pull consumer keeps up to
// pullReadsInFlight reads in flight, a push consumer up to pushReadsInFlight, one until a
// read has shown how far one reaches: each read after the first starts where the one
// before it is planned to end, bounded to the span the reads so far found to fit their
// limits. Called with mu held.
func (c *consumer) prefetch(ctx context.Context) {
	if len(c.ahead.Msgs) > c.out.prefetchLow() || c.ahead.UpTo == 0 {
		return
	}
	if c.ahead.Span() == 0 {
		if c.ahead.InFlight() == 0 {
			c.startPrefetch(ctx, false)
		}
		return
	}
	most := pullReadsInFlight
	if _, push := c.out.(*pusher); push {
		most = pushReadsInFlight
	}
	for c.ahead.InFlight() < most && c.startPrefetch(ctx, true) {
	}
}

// readFirst starts a new push consumer's first read of its backlog while it is activated,
// so that the read runs beside the count of its pending messages rather than after it: on
// a stream of 200,000 messages the count alone delayed the first delivery by tens of
// milliseconds. A consumer that starts from a list of last messages per subject reads
// that list first (loadStart), and a pull consumer reads what its first request asks for.
// Called before the consumer is shared, after the tail's high-water mark was raised.
func (c *consumer) readFirst(ctx context.Context) {
	if _, push := c.out.(*pusher); !push || c.start != nil {
		return
	}
	// The read-ahead of a consumer that has yet to read ends right before its next message.
	c.ahead.UpTo = c.st.Next() - 1
	if c.startPrefetch(ctx, false) {
		c.cs.m.TailMisses.Inc() // as the read the consumer would have made itself
	}
}

// startPrefetch starts the read after the read-ahead and the reads in flight, and reports
// whether it did. A chained read looks through no more than the span, so that the next
// one may start where it ends.
func (c *consumer) startPrefetch(ctx context.Context, chained bool) bool {
	from, hw := c.ahead.NextFrom(), c.sc.s.Tail().HighWater()
	if from < c.st.Next() || from > hw {
		return false // delivery moved past the read-ahead, or nothing more is committed
	}
	if c.cs.clock.Now().Before(c.retryAt) {
		return false
	}
	if _, _, covered := c.sc.s.Tail().Get(from); covered {
		return false
	}
	upTo := c.behindTail(from, hw)
	if chained {
		upTo = min(upTo, from+c.ahead.Span()-1)
	}
	r := c.ahead.Begin(from, upTo)
	if !c.goRead(ctx, r) {
		r.Finish(nil, 0, errStopping)
		return false
	}
	return true
}

// takePrefetch appends the oldest background read to the read-ahead, waiting for it if it
// is still running: the consumer needs it now. It reports whether the read-ahead grew or
// moved. Called with mu held; mu is released while it waits.
func (c *consumer) takePrefetch(ctx context.Context) bool {
	r := c.ahead.Oldest()
	if r == nil || !c.awaitRead(ctx, r) {
		return false
	}
	ok, err := c.ahead.Take()
	if err != nil {
		c.readFailed(ctx, err)
	}
	return ok
}

// dropAhead forgets the read-ahead, the start list's batch and any background reads of
// what follows.
func (c *consumer) dropAhead() {
	c.ahead.Drop()
	if c.start != nil {
		c.start.DropBatch()
	}
}

// load returns the message at seq, from the tail when it holds it. live is false when the
// message no longer exists.
func (c *consumer) load(ctx context.Context, seq uint64) (pg.Message, bool, error) {
	if m, live, covered := c.sc.s.Tail().Get(seq); covered {
		c.cs.m.TailHits.Inc()
		return m, live, nil
	}
	if m, ok := c.ahead.Find(seq); ok {
		return m, true, nil
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
