package consumer

import (
	"context"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/cursor"
	"github.com/jetgres/jetgres/bridge/consumer/metrics"
	"github.com/jetgres/jetgres/bridge/consumer/pending"
	"github.com/jetgres/jetgres/bridge/consumer/purgemove"
	"github.com/jetgres/jetgres/bridge/consumer/readahead"
	"github.com/jetgres/jetgres/bridge/consumer/replay"
	"github.com/jetgres/jetgres/bridge/consumer/startpos"
	"github.com/jetgres/jetgres/bridge/consumer/storedinfo"
	"github.com/jetgres/jetgres/bridge/consumerstate"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
)

// ReadAheadMsgs caps the messages one read of PostgreSQL fetches for a consumer behind the
// tail, and ReadAheadBytes the bytes: a push consumer reads up to that many, with up to
// pushReadsInFlight reads in flight.
const (
	ReadAheadMsgs  = readAheadMax
	ReadAheadBytes = readAheadBytes
)

const (
	readAheadMax   = 1000
	readAheadMin   = 64
	readAheadBytes = 8 << 20
	// prefetchBelow is how few read-ahead messages a consumer that is delivering from
	// PostgreSQL may have left before it reads the next batch in the background, so that
	// its clients do not wait for that read.
	prefetchBelow = readAheadMax / 2
	// readRetry is how long a consumer waits after a failed read before it tries again.
	readRetry = 100 * time.Millisecond
)

type evKind uint8

const (
	evPull evKind = iota
	evAck
	evPurged
	evConfig
	evFlowControl // a client answered the flow-control request named in reply
	evReset       // CONSUMER.RESET: cfg.start is where delivery starts again
)

// event is work for a consumer's goroutine, in arrival order. Acks come by the thousand
// per wake, so it holds only what handling one needs.
type event struct {
	kind       evKind
	ack        jswire.AckKind // what an evAck asks for
	sseq, dseq uint64         // the delivery an evAck or a flow-control answer acks
	reply      string
	data       []byte
	cfg        *configChange
	purge      *purgemove.Move // how an evPurged moves the consumer, nil when it does not
}

// configChange is an evConfig's update, already stored in PostgreSQL, or an evReset's
// reset point and start; applied is closed once the goroutine runs with it.
type configChange struct {
	cfg      server.ConsumerConfig
	resetSeq uint64
	start    *startpos.Position
	applied  chan struct{}
}

type stopReason uint8

const (
	stopNone     stopReason = iota
	stopShutdown            // the process stops: waiting clients time out and retry elsewhere
	stopDeleted             // deleted: waiting requests get 409 Consumer Deleted
	stopLost                // another replica took over: waiting requests get 409 Leadership Change
)

// consumer is one pull or push consumer served by this process. One goroutine (run) owns
// its state: it takes pull requests, acks and flow-control answers in arrival order,
// delivers, expires, and parks. A push consumer delivers as if to a pull request that never
// ends, addressed to its deliver subject while that has interest. A parked consumer holds no
// permit and no connection: only its waiting requests.
type consumer struct {
	cs      *Engine
	sc      *streamConsumers
	id      int64 // its row's id: the key of its lock
	name    string
	created time.Time

	qmu   sync.Mutex
	queue []event
	wake  chan struct{}
	stopR atomic.Uint32
	done  chan struct{}
	// ctx bounds the consumer's own database calls and reads; stop cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	pend   pending.Tracker // matching commits counted off the goroutine, and npc's staleness
	parked atomic.Bool     // waiting requests and nothing to send: the ticker polls for it
	// filter holds the consumer's filter subjects. It is read off the goroutine (the commit
	// path, retention), so a reconfiguration stores a fresh slice rather than writing one.
	filter atomic.Pointer[[]string]
	// pushTo and pushActive mirror a push consumer's deliver subject and whether it had
	// interest when its goroutine last looked, for the interest watcher.
	pushTo     atomic.Pointer[pushDest]
	pushActive atomic.Bool

	// mu guards what follows. The goroutine holds it while it works, except around database
	// reads; API requests take it briefly to report.
	mu         sync.Mutex
	reply      []byte // a delivery's reply subject, built anew for each in the same array
	cfg        server.ConsumerConfig
	st         *consumerstate.State
	out        deliveryStrategy // to waiting pull requests or to the deliver subject
	start      *startpos.Position
	ahead      *readahead.Lookahead // read from PostgreSQL, not yet delivered, and the reads of what follows
	npc        int64                // num_pending: matching messages never delivered, from next on
	lastActive time.Time
	retryAt    time.Time
	unlocked   bool // mu was released to wait for a read: the pump's reading of the clock is old
	replay     replay.Pacer

	// initial is the consumer's info as of its creation, before its goroutine delivered
	// anything: the create response reports it, as nats-server's does, since a push
	// consumer may have delivered by the time the response is written. Taken once.
	initial *server.ConsumerInfo

	cw         *cursor.Writer
	tally      metrics.Tally
	ackedFloor bool // an ack moved the floor; the cursor writer is told after the queue
}

func newConsumer(cs *Engine, sc *streamConsumers, row pg.Consumer, cfg server.ConsumerConfig, start *startpos.Position) *consumer {
	floor := consumerstate.Pair{Consumer: row.AckConsumerSeq, Stream: row.AckStreamSeq}
	next := floor.Stream + 1
	if start != nil {
		next = start.Next
		if len(start.Skip) == 0 {
			start = nil
		}
	}
	now := cs.clock.Now()
	c := &consumer{
		cs:         cs,
		sc:         sc,
		id:         row.ID,
		name:       row.Name,
		created:    row.Created,
		wake:       make(chan struct{}, 1),
		done:       make(chan struct{}),
		cfg:        cfg,
		st:         consumerstate.New(consumerstate.ConfigOf(&cfg), floor, next),
		start:      start,
		ahead:      readahead.New(readAheadMax, readAheadBytes),
		lastActive: now,
	}
	c.ctx, c.cancel = context.WithCancel(cs.ctx)
	if row.ShownStreamSeq < floor.Stream {
		c.st.ShowFrom(row.ShownStreamSeq)
	}
	if cfg.ReplayPolicy == server.ReplayOriginal {
		c.replay = replay.Original(sc.s.Tail().HighWater())
	}
	c.cw = cursor.NewWriter(cs.ctx, &cs.cursors, c, c.done, sc.s.Name(), pg.CursorParams{StreamID: sc.s.ID(), Name: row.Name,
		Created: row.Created, Owner: cs.owner, AckStreamSeq: floor.Stream, AckConsumerSeq: floor.Consumer, ShownStreamSeq: row.ShownStreamSeq})
	c.setFilters(&cfg)
	c.out = newDelivery(c, &cfg, now)
	return c
}

// post queues an event for the goroutine; false when the queue is full or it stopped.
func (c *consumer) post(ev event) bool { return c.enqueue(ev, consumerQueueMax) }

// postControl queues a configuration change or a purge, which the queue's bound must not
// drop: they come from API requests, a few at a time, and a consumer that missed one would
// go on serving what is no longer so. false once the consumer stopped.
func (c *consumer) postControl(ev event) bool { return c.enqueue(ev, math.MaxInt) }

func (c *consumer) enqueue(ev event, bound int) bool {
	c.qmu.Lock()
	if len(c.queue) >= bound || c.stopR.Load() != uint32(stopNone) {
		c.qmu.Unlock()
		return false
	}
	if c.queue == nil {
		c.queue = *eventQueues.Get().(*[]event)
	}
	c.queue = append(c.queue, ev)
	c.qmu.Unlock()
	c.signal()
	return true
}

func (c *consumer) signal() { wake.Poke(c.wake) }

func (c *consumer) take() []event {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queue
	c.queue = nil
	return q
}

// eventQueues recycles the consumers' event queues. A busy consumer takes up to a
// thousand acks per wake; in a pool its queue is reused without an idle consumer keeping
// one, and the garbage collector empties the pool of what nobody takes again.
var eventQueues = sync.Pool{New: func() any { return new([]event) }}

// recycle hands a handled queue back for reuse.
func (c *consumer) recycle(q []event) {
	if cap(q) == 0 {
		return
	}
	clear(q)
	q = q[:0]
	eventQueues.Put(&q)
}

// stop asks the goroutine to end; the first reason wins.
func (c *consumer) stop(r stopReason) {
	c.stopR.CompareAndSwap(uint32(stopNone), uint32(r))
	// A database call in flight must not hold the stop up: a fenced replica whose
	// connections went silent would otherwise keep the consumer, and its MSG.NEXT
	// subscription, for as long as the call's timeout.
	c.cancel()
	c.signal()
}

// committed counts freshly committed rows the consumer will want, of a commit or a read that
// covers the sequences from from on, and wakes it if it waits.
func (c *consumer) committed(msgs []pg.Message, from uint64) {
	if len(msgs) == 0 {
		return
	}
	n, gap := c.pend.Add(msgs, from, c.matchFilters)
	if gap {
		c.markStale(from - 1)
	}
	if n > 0 && c.parked.Load() {
		c.signal()
	}
}

func (c *consumer) setFilters(cfg *server.ConsumerConfig) {
	f := jswire.ConsumerFilters(cfg)
	c.filter.Store(&f)
}

func (c *consumer) filters() []string { return *c.filter.Load() }

// matchFilters runs on the commit path, off the goroutine, so it reads the filters through
// an atomic rather than wait for mu.
func (c *consumer) matchFilters(subject string) bool {
	return jswire.FiltersMatch(c.filters(), subject)
}

// run is the consumer's goroutine.
func (c *consumer) run() {
	defer close(c.done)
	defer c.cancel()
	clock := c.cs.clock
	timer := clock.NewTimer(time.Hour)
	defer timer.Stop()
	ctx := c.ctx
	for {
		evs := c.take()
		c.mu.Lock()
		now := clock.Now()
		for i := range evs {
			c.handle(ctx, &evs[i], now)
		}
		c.recycle(evs)
		if c.ackedFloor {
			c.ackedFloor = false
			c.floorMoved()
		}
		c.tally.Flush(c.cs.m) // the acks, before a stop or an inactive delete skips pump
		if r := stopReason(c.stopR.Load()); r != stopNone {
			c.shutdown(r)
			c.mu.Unlock()
			return
		}
		if c.inactive(now) {
			c.mu.Unlock()
			c.cs.deleteInactive(c)
			continue
		}
		hw := c.sc.s.Tail().HighWater()
		c.pump(ctx)
		wake := c.nextWake(clock.Now())
		parked := c.out.waits()
		wasParked := c.parked.Swap(parked)
		c.mu.Unlock()
		if parked {
			// A commit that raised the high-water mark before it could see parked set has
			// not signalled: look once more.
			if c.sc.s.Tail().HighWater() > hw {
				c.signal()
			}
			// Only a consumer that starts waiting brings the ticker back to its base period;
			// one that keeps waiting (heartbeats, sweeps) lets it back off.
			if !wasParked {
				c.cs.ticker.Kick()
			}
		}
		if !wake.IsZero() {
			timer.Reset(max(wake.Sub(clock.Now()), 0))
		}
		select {
		case <-ctx.Done():
			c.stop(stopShutdown)
		case <-c.wake:
		case <-timer.C():
		}
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
	}
}

func (c *consumer) handle(ctx context.Context, ev *event, now time.Time) {
	switch ev.kind {
	case evPull:
		c.out.request(c, ev.reply, ev.data, now)
	case evAck:
		c.handleAck(ctx, ev, now)
	case evPurged:
		c.dropAhead()
		if p := ev.purge; p != nil && c.st.Purged(p.Start, p.Last, p.Wider, p.IsGone, now) {
			c.floorMoved()
		}
	case evFlowControl:
		if p, ok := c.out.(*pusher); ok {
			p.flowControlAnswered(c, ev, now)
		}
	case evConfig:
		old := c.filters()
		c.cfg = ev.cfg.cfg
		c.setFilters(&c.cfg)
		c.st.SetConfig(consumerstate.ConfigOf(&c.cfg))
		c.out = c.out.configure(c, &c.cfg, now)
		c.dropAhead()
		// The filters are all of the configuration that the count depends on.
		if !slices.Equal(old, c.filters()) {
			c.pend.SetStale()
		}
		close(ev.cfg.applied)
	case evReset:
		c.reset(ev.cfg.resetSeq, ev.cfg.start)
		close(ev.cfg.applied)
	}
}

// reset forgets every delivery, as CONSUMER.RESET does: the ack floor goes just below seq
// and is written, delivery starts again at start, and num_pending is counted again.
func (c *consumer) reset(seq uint64, start *startpos.Position) {
	c.dropAhead()
	c.st = consumerstate.New(consumerstate.ConfigOf(&c.cfg), consumerstate.Pair{Stream: seq - 1}, start.Next)
	c.start = nil
	if len(start.Skip) > 0 {
		c.start = start
	}
	c.pend.SetStale()
	c.floorMoved()
}

// msgsPending is nats-server's count for no-wait requests: messages never delivered that
// match, plus those queued for redelivery.
func (c *consumer) msgsPending() int64 {
	c.applyCommitted()
	return max(c.npc, 0) + int64(c.st.NumQueued())
}

// hasWork is the cheap in-memory check: is anything deliverable without asking PostgreSQL
// whether more was committed.
func (c *consumer) hasWork() bool {
	return c.st.HasRedeliveries() || len(c.ahead.Msgs) > 0 || c.start != nil || c.st.Next() <= c.sc.s.Tail().HighWater()
}

// source says where a candidate message came from, so that delivering it consumes it there.
type source uint8

const (
	srcRedelivery source = iota
	srcStart
	srcAhead
	srcTail
)

// pump delivers what it can to the waiting requests, then settles no-wait requests and
// heartbeats. Called with mu held.
func (c *consumer) pump(ctx context.Context) {
	c.recountPending(ctx)
	c.applyCommitted()
	now := c.cs.clock.Now()
	if _, moved := c.st.Expire(now); moved {
		c.floorMoved()
	}
	c.out.sweep(c, now)
	eos := true
	sent := 0
	// Deliveries that move the ack floor (every one, with ack none) tell the cursor writer
	// once per yield and at the end, not each: the write is fused all the same.
	floorMoved := false
	for c.out.ready(c, now) && ctx.Err() == nil && !c.paused(now) {
		m, dc, src, found := c.next(ctx)
		if found != nextFound {
			eos = found == nextEmpty
			break
		}
		if c.replay.On() && c.replay.Hold(m, c.cs.clock.Now()) {
			eos = false
			break
		}
		hdr, data := m.Header, m.Data
		if c.cfg.HeadersOnly {
			hdr, data = jswire.AppendHeaders(m.Header, server.JSMsgSize, strconv.Itoa(len(m.Data))), nil
		}
		uncounted := false
		if dc == 1 && m.Seq > c.pend.Through() {
			var added int64
			added, uncounted = c.pend.Claim(m.Seq)
			c.npc += added
		}
		pending := uint64(max(c.npc, 0))
		if dc == 1 && pending > 0 && !uncounted {
			pending--
		}
		info := jswire.AckInfo{Stream: c.sc.s.Name(), Consumer: c.name, Delivered: dc, StreamSeq: m.Seq, ConsumerSeq: c.st.Delivered().Consumer + 1, TS: m.TS, Pending: pending}
		reply := jswire.AppendAckSubject(c.reply[:0], info)
		size := len(m.Subject) + len(reply) + len(hdr) + len(data)
		// The clock is read once every clockEvery deliveries: a time a few microseconds old
		// serves ack deadlines and latencies as well, and reading it was an eighth of a
		// push consumer's pump.
		if sent%clockEvery == 0 || c.unlocked {
			c.unlocked = false
			now = c.cs.clock.Now()
		}
		to, size, ok := c.out.route(c, m.Subject, size, dc > 1, now)
		if !ok {
			eos = false // requests wait that may not take it (priority groups)
			break
		}
		if to.pinned {
			hdr = jswire.AppendHeaders(hdr, server.JSPullRequestNatsPinId, to.pin)
		}
		reply = append(append(reply, '@'), m.Subject...)
		c.reply = reply
		if err := c.cs.link.PublishQueue(to.subject, reply, to.group, hdr, data); err != nil {
			// Not sent (the link is full or closing), so not delivered: it stays next in
			// line and is tried again shortly, not after an ack wait.
			c.cs.log.Debug("delivery not sent", "stream", c.sc.s.Name(), "consumer", c.name, "err", err)
			if uncounted {
				c.npc++ // claimed from its commit; the next try takes it off again
			}
			c.retryAt = c.cs.clock.Now().Add(readRetry)
			eos = false
			break
		}
		if dc == 1 {
			c.npc = int64(pending)
		}
		_, moved := c.st.Deliver(m.Seq, dc, now)
		// After Deliver: taking the last of a start list moves Next past what it skipped,
		// and the floor must then see this delivery pending.
		c.consume(src)
		if src == srcAhead && len(c.ahead.Msgs) <= c.out.prefetchLow() {
			// A push consumer's pump may not end before its read-ahead does.
			c.prefetch(ctx)
		}
		c.delivered(to, size, m, dc, now)
		sent++
		floorMoved = floorMoved || moved
		if sent%c.out.yieldEvery() == 1 {
			if floorMoved {
				floorMoved = false
				c.floorMoved()
			}
			runtime.Gosched()
		}
	}
	if floorMoved {
		c.floorMoved()
	}
	c.replay.Delivering(c.st.Next())
	c.out.settle(c, c.cs.clock.Now(), eos)
	if sent > 0 {
		c.prefetch(ctx)
	}
	c.tally.Flush(c.cs.m)
}

// clockEvery is how many deliveries pump makes with one reading of the clock.
const clockEvery = 32

// deliveryYield is how many deliveries pump queues on the link between two yields of its
// processor. A delivery readies the link's writer on this goroutine's processor, where it
// waits while the other processor is busy: without the yields, in a Fetch of 500 the
// writer's first write came a quarter of a millisecond after the first delivery was
// queued, with some 300 messages in it, while the client sat idle. Yielding at the first
// delivery and then every deliveryYield lets the first messages travel while the rest
// are prepared.
const deliveryYield = 64

// deliveryYieldPush is deliveryYield for a push consumer, whose pump only ends when the
// stream, flow control or max_ack_pending does: the first message travels at once all the
// same, and after that the writer writes larger chunks, in fewer system calls on both ends
// of the link. Draining a stream with ack none, 512 delivered some 5 % more than 64.
const deliveryYieldPush = 512

// applyCommitted folds commits counted off the goroutine into num_pending.
func (c *consumer) applyCommitted() {
	c.npc += c.pend.Take()
}

// delivered accounts a message sent to to: the delivery's own accounting, then the
// consumer's.
func (c *consumer) delivered(to deliveryTarget, size int, m pg.Message, dc uint64, now time.Time) {
	c.out.sent(c, to, size, now)
	if dc == 1 {
		c.cs.m.E2ELatency.Observe(max(float64(now.UnixNano()-m.TS)/1e9, 0))
	} else {
		c.cs.m.Redeliveries.Inc()
	}
	c.tally.Delivered++
	c.lastActive = now
}

// nextWake is when the goroutine must look again without being signalled: a request
// expiring, a heartbeat due, an ack wait running out, a retry, an interest sweep, or the
// inactivity threshold.
func (c *consumer) nextWake(now time.Time) time.Time {
	var t time.Time
	earlier := func(u time.Time) {
		if !u.IsZero() && (t.IsZero() || u.Before(t)) {
			t = u
		}
	}
	c.out.wake(c, now, earlier)
	earlier(c.st.NextDeadline())
	earlier(c.replay.At())
	earlier(c.pend.RecountWake())
	return t
}

// paused reports whether pause_until holds deliveries back at now.
func (c *consumer) paused(now time.Time) bool {
	paused, _ := storedinfo.PausedAt(c.cfg.PauseUntil, now)
	return paused
}

// inactive reports whether the consumer passed its inactive threshold with no request, or,
// for a push consumer, without interest in its deliver subject.
func (c *consumer) inactive(now time.Time) bool {
	th := c.cfg.InactiveThreshold
	if th <= 0 || now.Sub(c.lastActive) < th {
		return false
	}
	return c.out.inactive(c, now)
}

// shutdown answers the waiting requests as the reason demands. Called with mu held.
func (c *consumer) shutdown(r stopReason) {
	var hdr []byte
	switch r {
	case stopDeleted:
		hdr = jswire.StatusHeader(409, jswire.DescDeleted)
	case stopLost:
		hdr = jswire.StatusHeader(409, jswire.DescLeadership)
	}
	c.out.stopped(c, hdr)
	c.parked.Store(false)
	c.cs.remove(c)
}
