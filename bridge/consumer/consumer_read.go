package consumer

// The consumer's read path: what goes out next (a redelivery, the start list, the
// read-ahead, the tail cache, PostgreSQL), the read-ahead and its background prefetch, and
// the pacing of replay_policy original.

import (
	"context"
	"errors"
	"time"

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
		c.cs.m.tailMisses.Inc()
		if !c.readAhead(ctx, from, hw) {
			return m, 0, 0, nextFailed
		}
	}
}

// consume takes a delivered candidate off where it came from.
func (c *consumer) consume(src source) {
	switch src {
	case srcStart:
		c.start.skip = c.start.skip[1:]
		if len(c.start.skip) == 0 {
			if c.st.Skip(c.start.resume + 1) {
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

// loadStart returns the first message of the start list, from the tail when it holds it.
// Otherwise it reads the list's messages from PostgreSQL a batch at a time, as many as
// one read takes: one read per message cost a key-value watcher of 100,000 keys as many
// round trips, about 30 µs of CPU per key, most of it PostgreSQL's. live is false when the
// message no longer exists. Called with mu held; mu is released while it reads.
func (c *consumer) loadStart(ctx context.Context) (pg.Message, bool, error) {
	st := c.start
	seq := st.skip[0]
	if m, live, covered := c.sc.s.Tail().Get(seq); covered {
		c.cs.m.tailHits.Inc()
		return m, live, nil
	}
	if seq > st.readTo {
		if err := c.readStart(ctx); err != nil {
			return pg.Message{}, false, err
		}
		if seq > st.readTo {
			return c.load(ctx, seq)
		}
	}
	// Both are in sequence order and the list is taken from its front: what lies below seq
	// is behind it for good.
	i := tailcache.SearchSeq(st.read, seq)
	st.read = st.read[i:]
	if len(st.read) > 0 && st.read[0].Seq == seq {
		return st.read[0], true, nil
	}
	return pg.Message{}, false, nil // looked through and not found: deleted since listed
}

// readStart reads the messages of the start list's next batch: from its first sequence
// through that of its readAheadMax-th, all that match the consumer's filters, which the
// list's sequences all do. Rows between them that are not the last of their subject come
// along and are passed over.
func (c *consumer) readStart(ctx context.Context) error {
	if c.cs.clock.Now().Before(c.retryAt) {
		return errRetryLater
	}
	st := c.start
	p := pg.ReadParams{StreamID: c.sc.s.ID(), From: st.skip[0], UpTo: st.skip[min(len(st.skip), readAheadMax)-1], MaxMsgs: readAheadMax, MaxBytes: readAheadBytes}
	filters := c.filters()
	c.cs.m.tailMisses.Inc()
	c.unlocked = true
	c.mu.Unlock()
	msgs, through, err := c.sc.reads.read(ctx, c.cs, p, filters)
	c.mu.Lock()
	if err != nil {
		if ctx.Err() == nil {
			c.cs.warnRead.Warn(c.cs.log, c.cs.clock.Now(), "consumer read failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
		}
		c.retryAt = c.cs.clock.Now().Add(readRetry)
		return err
	}
	st.read, st.readTo = msgs, through
	return nil
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
	msgs, through, err := c.sc.reads.read(ctx, c.cs, pg.ReadParams{StreamID: c.sc.s.ID(), From: from, UpTo: upTo, MaxMsgs: n, MaxBytes: readAheadBytes}, filters)
	c.mu.Lock()
	if err != nil {
		if ctx.Err() == nil {
			c.cs.warnRead.Warn(c.cs.log, c.cs.clock.Now(), "consumer read failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
		}
		c.retryAt = c.cs.clock.Now().Add(readRetry)
		return false
	}
	c.dropAhead()
	c.learnSpan(from, through, msgs)
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

// prefetch is a read of a batch after the read-ahead, made in the background.
type prefetch struct {
	gen        uint64        // the consumer's aheadGen when it started
	from, upTo uint64        // what it reads, unless its count or byte limit cuts it short
	done       chan struct{} // closed once msgs, through and err are set

	msgs    []pg.Message
	through uint64
	err     error
}

// pushReadsInFlight is how many background reads a push consumer keeps going while it
// delivers from PostgreSQL. With one, the consumer waited for nearly every read of a
// backlog (90 of 100 reads, 40 % of its time, on a busy machine): a read of a batch took
// longer than sending it, and PostgreSQL sat idle while the consumer sent. The second read
// runs while the first is taken and sent.
const pushReadsInFlight = 2

// spanMargin is the share of a read's expected span that a read chained behind another one
// looks through: a little short of its limits, so that variations in density and size
// rarely cut it, since a cut read throws away the reads chained behind it.
const spanMargin = 0.875

// prefetch starts reading the next batches in the background when the consumer delivers
// from PostgreSQL and its read-ahead runs low; a consumer that keeps up with the tail
// cache, or waits at the head of the stream, never does. A pull consumer keeps one read
// in flight, a push consumer up to pushReadsInFlight: each read after the first starts
// where the one before it is planned to end, bounded to the span the reads so far found
// to fit their limits. Called with mu held.
func (c *consumer) prefetch(ctx context.Context) {
	if len(c.ahead) > c.out.prefetchLow() || c.aheadUpTo == 0 {
		return
	}
	if _, push := c.out.(*pusher); !push || c.span == 0 {
		if len(c.pfs) == 0 {
			c.startPrefetch(ctx, false)
		}
		return
	}
	for len(c.pfs) < pushReadsInFlight && c.startPrefetch(ctx, true) {
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
	c.aheadUpTo = c.st.Next() - 1
	if c.startPrefetch(ctx, false) {
		c.cs.m.tailMisses.Inc() // as the read the consumer would have made itself
	}
}

// startPrefetch starts the read after the read-ahead and the reads in flight, and reports
// whether it did. A chained read looks through no more than the span, so that the next
// one may start where it ends.
func (c *consumer) startPrefetch(ctx context.Context, chained bool) bool {
	from, hw := c.aheadUpTo+1, c.sc.s.Tail().HighWater()
	if n := len(c.pfs); n > 0 {
		from = c.pfs[n-1].upTo + 1
	}
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
		upTo = min(upTo, from+c.span-1)
	}
	pf := &prefetch{gen: c.aheadGen, from: from, upTo: upTo, done: make(chan struct{})}
	c.pfs = append(c.pfs, pf)
	p := pg.ReadParams{StreamID: c.sc.s.ID(), From: from, UpTo: upTo, MaxMsgs: readAheadMax, MaxBytes: readAheadBytes}
	filters := c.filters()
	if !c.cs.g.Go(func() {
		pf.msgs, pf.through, pf.err = c.sc.reads.read(ctx, c.cs, p, filters)
		close(pf.done)
		c.signal()
	}) {
		pf.err = errStopping
		close(pf.done)
		return false
	}
	return true
}

// takePrefetch appends the oldest background read to the read-ahead, waiting for it if it
// is still running: the consumer needs it now. It reports whether the read-ahead grew or
// moved. Called with mu held; mu is released while it waits.
func (c *consumer) takePrefetch(ctx context.Context) bool {
	if len(c.pfs) == 0 {
		return false
	}
	pf := c.pfs[0]
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
	if pf.gen != c.aheadGen || pf.from != c.aheadUpTo+1 || pf.err != nil {
		// Thrown away meanwhile, failed, or the read before it was cut short: the reads
		// behind it start where this one was planned to end, so they go too.
		clear(c.pfs)
		c.pfs = c.pfs[:0]
		if pf.err != nil && pf.gen == c.aheadGen {
			if ctx.Err() == nil {
				c.cs.warnRead.Warn(c.cs.log, c.cs.clock.Now(), "consumer read failed", "stream", c.sc.s.Name(), "consumer", c.name, "err", pf.err)
			}
			c.retryAt = c.cs.clock.Now().Add(readRetry)
		}
		return false
	}
	c.pfs[0] = nil
	c.pfs = c.pfs[1:]
	c.learnSpan(pf.from, pf.through, pf.msgs)
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

// learnSpan takes from a read of [from, through] that found msgs how many sequences a read
// may look through and stay within its count and byte limits, at the same density of
// matching messages and the same sizes.
func (c *consumer) learnSpan(from, through uint64, msgs []pg.Message) {
	if through < from {
		return
	}
	looked := float64(through - from + 1)
	if len(msgs) == 0 {
		c.span = uint64(min(2*looked, float64(readAheadMax)*spanEmptyMax))
		return
	}
	size := 0
	for i := range msgs {
		size += int(msgs[i].Size())
	}
	fit := min(float64(readAheadMax)/float64(len(msgs)), float64(readAheadBytes)/float64(max(size, 1)))
	c.span = uint64(max(looked*fit*spanMargin, 1))
}

// spanEmptyMax bounds the span, in multiples of readAheadMax, that reads finding nothing
// widen it to: each doubles it.
const spanEmptyMax = 64

// dropAhead forgets the read-ahead and any background reads of what follows it.
func (c *consumer) dropAhead() {
	c.ahead, c.aheadUpTo = nil, 0
	if c.start != nil {
		c.start.read, c.start.readTo = nil, 0
	}
	clear(c.pfs)
	c.pfs = c.pfs[:0]
	c.aheadGen++
}

// load returns the message at seq, from the tail when it holds it. live is false when the
// message no longer exists.
func (c *consumer) load(ctx context.Context, seq uint64) (pg.Message, bool, error) {
	if m, live, covered := c.sc.s.Tail().Get(seq); covered {
		c.cs.m.tailHits.Inc()
		return m, live, nil
	}
	// c.ahead is in sequence order: it is read ORDER BY seq and only ever extended past its end.
	if i := tailcache.SearchSeq(c.ahead, seq); i < len(c.ahead) && c.ahead[i].Seq == seq {
		return c.ahead[i], true, nil
	}
	c.cs.m.tailMisses.Inc()
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

// replay paces a consumer with replay_policy original, as nats-server does: from its start
// until it has caught up with the stream's last message of that moment, each message goes
// out as long after the one before as it was stored after it (gaps under a millisecond do
// not wait), redeliveries included; from then on messages go out at once.
type replay struct {
	on   bool
	upTo uint64 // the stream's last sequence when the consumer started
	last int64  // the stored time of the message delivered last, 0 before the first
	seq  uint64 // the message being held back, and until when
	at   time.Time
}

// hold reports whether m must wait, and otherwise takes it as delivered at now. The wait
// starts when m is first found due.
func (r *replay) hold(m pg.Message, now time.Time) bool {
	if gap := time.Duration(m.TS - r.last); r.last > 0 && gap > time.Millisecond {
		if r.seq != m.Seq || r.at.IsZero() {
			r.seq, r.at = m.Seq, now.Add(gap)
		}
		if now.Before(r.at) {
			return true
		}
	}
	r.last, r.seq, r.at = m.TS, 0, time.Time{}
	return false
}
