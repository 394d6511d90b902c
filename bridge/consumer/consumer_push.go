package consumer

import (
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/flowctl"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

// rateBurstDefault is how many bytes a rate-limited push consumer may send at once after an
// idle spell: nats-server's burst is the largest message the stream takes, whose default is
// the server's max payload.
const rateBurstDefault = 1 << 20

// pushDest is where a push consumer delivers, for readers off its goroutine.
type pushDest struct{ subject, group string }

// pusher is a push consumer's delivery to its deliver subject: the request that never
// ends.
type pusher struct {
	subject, group string
	// active says whether the deliver subject had interest when last looked, at link
	// interest version seenVer; known is false until the first look.
	active  bool
	known   bool
	seenVer uint64

	hb     time.Duration
	hbNext time.Time // the next idle heartbeat, unless a delivery comes first

	fc *flowctl.Window // nil without flow control
	// ackFC is the flow_control ack policy: answers to flow-control requests are the acks.
	ackFC bool

	// Rate limit: bytes per second, and the earliest time the next delivery may go.
	rate   float64
	burst  time.Duration
	rateAt time.Time
}

// newPusher builds the delivery to cfg's deliver subject and tells the interest watcher
// where it goes.
func newPusher(c *consumer, cfg *server.ConsumerConfig, now time.Time) *pusher {
	p := &pusher{subject: cfg.DeliverSubject, group: cfg.DeliverGroup, hb: cfg.Heartbeat,
		ackFC: cfg.AckPolicy == server.AckFlowControl}
	if p.hb > 0 {
		p.hbNext = now.Add(p.hb)
	}
	if cfg.FlowControl {
		p.fc = flowctl.New()
	}
	if cfg.RateLimit > 0 {
		// Configured in bits per second, paced in bytes, never slower than a byte a second.
		p.rate = max(float64(cfg.RateLimit/8), 1)
		p.burst = time.Duration(float64(rateBurstDefault) / p.rate * float64(time.Second))
	}
	c.pushTo.Store(&pushDest{subject: p.subject, group: p.group})
	return p
}

// configure applies a configuration update, keeping what is owed and paced.
func (p *pusher) configure(c *consumer, cfg *server.ConsumerConfig, now time.Time) deliveryStrategy {
	q := newPusher(c, cfg, now)
	if q.subject == p.subject && q.group == p.group {
		q.active, q.known, q.seenVer = p.active, p.known, p.seenVer
	}
	if q.fc != nil && p.fc != nil {
		q.fc = p.fc
	}
	if q.rate > 0 {
		q.rateAt = p.rateAt
	}
	return q
}

// request answers a pull request as nats-server does for a push consumer.
func (p *pusher) request(c *consumer, reply string, _ []byte, _ time.Time) {
	_ = c.cs.link.Publish(reply, "", jswire.StatusHeader(409, jswire.DescPushBased), nil)
}

// waits: a push consumer waits like a pull request while its deliver subject has interest.
func (p *pusher) waits() bool { return p.active }

// bound looks at the deliver subject's interest again if the link's changed since the
// last look, and reports it.
func (p *pusher) bound(c *consumer, now time.Time) bool {
	link := c.cs.link
	v := link.InterestVersion()
	if p.known && v == p.seenVer {
		return p.active
	}
	was := p.active && p.known
	p.active, p.known, p.seenVer = link.HasQueueInterest(p.subject, p.group), true, v
	c.pushActive.Store(p.active)
	switch {
	case was && !p.active:
		// The inactive threshold counts from here.
		c.lastActive = now
	case !was && p.active && p.hb > 0:
		p.hbNext = now.Add(p.hb)
	}
	// The interest watcher compared against the previous value: a change it heard between
	// the version read above and the store is this goroutine's to notice.
	if link.InterestVersion() != v {
		c.signal()
	}
	return p.active
}

// ready reports whether the next message may go to the deliver subject now: someone
// listens, flow control leaves room and the rate limit allows it.
func (p *pusher) ready(c *consumer, now time.Time) bool {
	if !p.bound(c, now) {
		return false
	}
	if p.fc != nil && p.fc.Closed() {
		if p.fc.Stall(now) {
			c.cs.m.FCStalls.Inc()
		}
		return false
	}
	return p.rate == 0 || !now.Before(p.rateAt)
}

// route: always the deliver subject, which nats-server counts in place of the message's.
func (p *pusher) route(_ *consumer, subject string, size int, _ bool, _ time.Time) (deliveryTarget, int, bool) {
	return deliveryTarget{subject: p.subject, group: p.group}, size + len(p.subject) - len(subject), true
}

// sent accounts a delivery of size bytes to the deliver subject: flow control, pacing
// and the heartbeat it makes unnecessary.
func (p *pusher) sent(c *consumer, _ deliveryTarget, size int, now time.Time) {
	c.tally.Pushed++
	if p.hb > 0 {
		p.hbNext = now.Add(p.hb)
	}
	if p.rate > 0 {
		// Virtual scheduling: an idle spell earns at most a burst's worth of sending.
		from := p.rateAt
		if earliest := now.Add(-p.burst); from.Before(earliest) {
			from = earliest
		}
		p.rateAt = from.Add(time.Duration(float64(size) / p.rate * float64(time.Second)))
	}
	if p.fc != nil && p.fc.Sent(size, p.ackFC && c.st.AtMaxAckPending()) {
		p.sendFlowControl(c)
	}
}

// sendFlowControl asks the client to answer once it has taken what was sent so far.
func (p *pusher) sendFlowControl(c *consumer) {
	reply := jswire.FlowControlSubject(c.sc.s.Name(), c.name, rand.Uint64())
	p.fc.Requested(reply)
	_ = c.cs.link.PublishQueue(p.subject, []byte(reply), p.group, jswire.FlowControlStatus(), nil)
	c.cs.m.FCRequests.Inc()
}

// flowControlAnswered takes the client's answer to a flow-control request. Under the
// flow_control ack policy the answer to the newest request acks what it names, as AckAll.
func (p *pusher) flowControlAnswered(c *consumer, ev *event, now time.Time) {
	if p.fc == nil {
		return
	}
	since := p.fc.StalledSince()
	if !p.fc.Answered(ev.reply) {
		return
	}
	if !since.IsZero() {
		c.cs.m.FCStallTime.Add(max(now.Sub(since).Seconds(), 0))
	}
	if !p.ackFC || ev.sseq == 0 {
		return
	}
	was := c.st.AckFloor()
	c.ack(ev.sseq, ev.dseq, "", now)
	// Retention hears of the ack once applied: an answer may name more than was delivered,
	// which a retention pass that came first would take for stale.
	if f := c.st.AckFloor(); f != was {
		c.cs.cfg.Retention.NoteAck(c.sc.s, c.name, f.Stream, nil)
	}
}

func (p *pusher) sweep(*consumer, time.Time) {}

// settle sends the idle heartbeat when it is due and someone listens.
func (p *pusher) settle(c *consumer, now time.Time, _ bool) {
	if p.hb == 0 || now.Before(p.hbNext) {
		return
	}
	p.hbNext = now.Add(p.hb)
	if !p.bound(c, now) {
		return
	}
	d, owed := c.st.Delivered(), ""
	if p.fc != nil {
		owed = p.fc.Owed()
	}
	_ = c.cs.link.PublishQueue(p.subject, nil, p.group, jswire.PushHeartbeatStatus(d.Consumer, d.Stream, owed), nil)
	c.cs.m.Heartbeats.Inc()
	// Pending deliveries are acked only by an answer, so nats-server asks for one at each
	// heartbeat, for a source that has nothing more coming.
	if p.ackFC && owed == "" && c.st.NumAckPending() > 0 {
		p.sendFlowControl(c)
	}
}

// wake: the inactive threshold while nobody listens; otherwise the heartbeat, the rate
// limit, a retry of a failed send or read, and the end of a pause.
func (p *pusher) wake(c *consumer, now time.Time, earlier func(time.Time)) {
	if !p.active {
		if th := c.cfg.InactiveThreshold; th > 0 {
			earlier(c.lastActive.Add(th))
		}
		return
	}
	if p.hb > 0 {
		earlier(p.hbNext)
	}
	if p.rate > 0 && p.rateAt.After(now) {
		earlier(p.rateAt)
	}
	if c.retryAt.After(now) {
		earlier(c.retryAt)
	}
	if c.paused(now) {
		earlier(*c.cfg.PauseUntil)
	}
}

func (p *pusher) inactive(c *consumer, now time.Time) bool { return !p.bound(c, now) }

// readSize: a push consumer's request never ends, so it always reads the most.
func (p *pusher) readSize() int { return readAheadMax }

// prefetchLow: a push consumer with nothing to hold it back delivers a batch in about the
// time PostgreSQL takes to read the next one, so it starts that read as soon as it takes a
// batch.
func (p *pusher) prefetchLow() int { return readAheadMax }

func (p *pusher) yieldEvery() int { return deliveryYieldPush }

func (p *pusher) numWaiting(time.Time) int { return 0 }

func (p *pusher) stopped(*consumer, []byte) {}

// onFlowControl runs on the link's read loop: it hands a client's answer to a flow-control
// request to its consumer, in order with that consumer's acks.
func (cs *Engine) onFlowControl(m *leaf.Msg) {
	streamName, consumerName, ok := jswire.ParseFlowControlSubject(m.Subject)
	if !ok {
		return
	}
	s := cs.cfg.Streams.Lookup(streamName)
	if s == nil {
		return
	}
	c := cs.served(s, consumerName)
	if c == nil {
		return
	}
	sseq, dseq, _ := jswire.FlowControlAck(m.Header)
	c.post(event{kind: evFlowControl, reply: strings.Clone(m.Subject), sseq: sseq, dseq: dseq})
}

// trackPush adds a push consumer to those the interest watcher looks after, or removes it.
func (cs *Engine) trackPush(c *consumer, push bool) {
	cs.pushMu.Lock()
	defer cs.pushMu.Unlock()
	if !push {
		delete(cs.pushers, c)
		return
	}
	if cs.pushers == nil {
		cs.pushers = make(map[*consumer]struct{})
	}
	cs.pushers[c] = struct{}{}
}

// interestLoop wakes the push consumers whose deliver subject gained or lost interest, as
// the link hears of it. A consumer looks for itself before each delivery; this is for the
// one that waits for a subscriber to come back, or for one to leave so that its inactive
// threshold starts.
func (cs *Engine) interestLoop() {
	link := cs.link
	var list []*consumer
	for {
		select {
		case <-cs.ctx.Done():
			return
		case <-link.InterestChanged():
		}
		cs.pushMu.Lock()
		list = list[:0]
		for c := range cs.pushers {
			list = append(list, c)
		}
		cs.pushMu.Unlock()
		for _, c := range list {
			to := c.pushTo.Load()
			if to != nil && link.HasQueueInterest(to.subject, to.group) != c.pushActive.Load() {
				c.signal()
			}
		}
		clear(list)
	}
}
