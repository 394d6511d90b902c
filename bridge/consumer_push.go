package bridge

import (
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

const (
	// fcWindowMax is nats-server's JsFlowControlMaxPending: the most bytes a flow-controlled
	// push consumer sends past the last answered request. The window starts at a sixteenth
	// of it and doubles with every answer, as nats-server ramps a slow start.
	fcWindowMax = 32 << 20
	// rateBurstDefault is how many bytes a rate-limited push consumer may send at once after
	// an idle spell: nats-server's burst is the largest message the stream takes, whose
	// default is the server's max payload.
	rateBurstDefault = 1 << 20
)

// pushDest is where a push consumer delivers, for readers off its goroutine.
type pushDest struct{ subject, group string }

// setPush builds or rebuilds the consumer's delivery to its deliver subject from cfg.
// Called with mu held, or before the consumer runs.
func (c *consumer) setPush(cfg *server.ConsumerConfig, now time.Time) {
	switch {
	case cfg.DeliverSubject == "":
		c.push = nil
		c.pushTo.Store(nil)
		return
	case c.push == nil:
		c.push = newPusher(cfg, now)
	default:
		c.push = c.push.reconfigure(cfg, now)
	}
	c.pushTo.Store(&pushDest{subject: cfg.DeliverSubject, group: cfg.DeliverGroup})
}

// pusher is a push consumer's delivery to its deliver subject: the request that never
// ends. The consumer's goroutine owns it, under the consumer's mu.
type pusher struct {
	subject, group string
	// active says whether the deliver subject had interest when last looked, at link
	// interest version seenVer; known is false until the first look.
	active  bool
	known   bool
	seenVer uint64

	hb     time.Duration
	hbNext time.Time // the next idle heartbeat, unless a delivery comes first

	// Flow control, as nats-server keeps it: bytes sent since the last answered request
	// (pbytes), the window they may reach (maxpb, 0 without flow control), and the request
	// owed (fcid) with the bytes it covers (fcsz).
	maxpb, pbytes, fcsz int
	fcid                string
	stalledSince        time.Time // when the window closed, zero while open

	// Rate limit: bytes per second, and the earliest time the next delivery may go.
	rate   float64
	burst  time.Duration
	rateAt time.Time
}

func newPusher(cfg *server.ConsumerConfig, now time.Time) *pusher {
	p := &pusher{subject: cfg.DeliverSubject, group: cfg.DeliverGroup, hb: cfg.Heartbeat}
	if p.hb > 0 {
		p.hbNext = now.Add(p.hb)
	}
	if cfg.FlowControl {
		p.maxpb = fcWindowMax / 16
	}
	if cfg.RateLimit > 0 {
		// Configured in bits per second, paced in bytes, never slower than a byte a second.
		p.rate = max(float64(cfg.RateLimit/8), 1)
		p.burst = time.Duration(float64(rateBurstDefault) / p.rate * float64(time.Second))
	}
	return p
}

// reconfigure applies a configuration update, keeping what is owed and paced.
func (p *pusher) reconfigure(cfg *server.ConsumerConfig, now time.Time) *pusher {
	q := newPusher(cfg, now)
	if q.subject == p.subject && q.group == p.group {
		q.active, q.known, q.seenVer = p.active, p.known, p.seenVer
	}
	if q.maxpb > 0 && p.maxpb > 0 {
		q.maxpb, q.pbytes, q.fcsz, q.fcid, q.stalledSince = p.maxpb, p.pbytes, p.fcsz, p.fcid, p.stalledSince
	}
	if q.rate > 0 {
		q.rateAt = p.rateAt
	}
	return q
}

// windowClosed reports whether flow control holds delivery back until the client answers.
func (p *pusher) windowClosed() bool { return p.maxpb > 0 && p.pbytes > p.maxpb }

// isPush reports whether the consumer delivers to a deliver subject.
func (c *consumer) isPush() bool { return c.push != nil }

// pushBound looks at the deliver subject's interest again if the link's changed since the
// last look, and reports it. Called with mu held.
func (c *consumer) pushBound(now time.Time) bool {
	p, link := c.push, c.cs.b.link
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

// pushReady reports whether the next message may go to the deliver subject now: someone
// listens, flow control leaves room and the rate limit allows it. Called with mu held.
func (c *consumer) pushReady(now time.Time) bool {
	p := c.push
	if !c.pushBound(now) {
		return false
	}
	if p.windowClosed() {
		if p.stalledSince.IsZero() {
			p.stalledSince = now
			c.cs.m.fcStalls.Inc()
		}
		return false
	}
	return p.rate == 0 || !now.Before(p.rateAt)
}

// pushed accounts a delivery of size bytes to the deliver subject: flow control, pacing
// and the heartbeat it makes unnecessary. Called with mu held.
func (c *consumer) pushed(size int, now time.Time) {
	p := c.push
	c.tally.pushed++
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
	if p.maxpb == 0 {
		return
	}
	p.pbytes += size
	switch {
	case p.fcid == "" && p.pbytes > p.maxpb/2:
		c.sendFlowControl()
	case p.fcid != "" && p.pbytes-p.fcsz >= p.maxpb:
		// nats-server widens what the request owed covers once the window passed it.
		p.fcsz += size
	}
}

// sendFlowControl asks the client to answer once it has taken what was sent so far.
func (c *consumer) sendFlowControl() {
	p := c.push
	p.fcsz, p.fcid = p.pbytes, jswire.FlowControlSubject(c.sc.s.name, c.name, rand.Uint64())
	_ = c.cs.b.link.PublishQueue(p.subject, []byte(p.fcid), p.group, jswire.FlowControlStatus(), nil)
	c.cs.m.fcRequests.Inc()
}

// flowControlAnswered takes the client's answer to a flow-control request; only the newest
// counts, as in nats-server. Called with mu held.
func (c *consumer) flowControlAnswered(subject string) {
	p := c.push
	if p == nil || p.fcid == "" || subject != p.fcid {
		return
	}
	p.maxpb = min(p.maxpb*2, fcWindowMax)
	p.pbytes = max(p.pbytes-p.fcsz, 0)
	p.fcid, p.fcsz = "", 0
	p.stalledSince = time.Time{}
}

// pushIdle sends the idle heartbeat when it is due and someone listens. Called with mu held.
func (c *consumer) pushIdle(now time.Time) {
	p := c.push
	if p.hb == 0 || now.Before(p.hbNext) {
		return
	}
	p.hbNext = now.Add(p.hb)
	if !c.pushBound(now) {
		return
	}
	d := c.st.Delivered()
	_ = c.cs.b.link.PublishQueue(p.subject, nil, p.group, jswire.PushHeartbeatStatus(d.Consumer, d.Stream, p.fcid), nil)
	c.cs.m.heartbeats.Inc()
}

// pushWake is when a push consumer must look again without being signalled. Called with mu
// held.
func (c *consumer) pushWake(now time.Time, earlier func(time.Time)) {
	p := c.push
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

// onFlowControl runs on the link's read loop: it hands a client's answer to a flow-control
// request to its consumer, in order with that consumer's acks.
func (cs *consumerSide) onFlowControl(m *leaf.Msg) {
	streamName, consumerName, ok := jswire.ParseFlowControlSubject(m.Subject)
	if !ok {
		return
	}
	s := cs.b.lookup(streamName)
	if s == nil {
		return
	}
	if c := cs.served(s, consumerName); c != nil {
		c.post(event{kind: evFlowControl, reply: strings.Clone(m.Subject)})
	}
}

// trackPush adds a push consumer to those the interest watcher looks after, or removes it.
func (cs *consumerSide) trackPush(c *consumer, push bool) {
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
func (cs *consumerSide) interestLoop() {
	link := cs.b.link
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
