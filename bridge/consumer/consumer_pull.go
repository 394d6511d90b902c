package consumer

import (
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/jswire"
)

// deliveryStrategy is where a consumer's messages go: to the pull requests waiting for them (a
// puller) or to a push consumer's deliver subject (a pusher). It is chosen when the
// consumer is built and never changes, as JetStream refuses an update between push and
// pull; an update reconfigures it. The consumer's goroutine owns it: every method is called
// with the consumer's mu held.
type deliveryStrategy interface {
	// request takes a MSG.NEXT request (or an ack's next), received at now.
	request(c *consumer, reply string, body []byte, now time.Time)
	// waits reports whether a client waits for the next message, so that the consumer
	// parks for the ticker rather than sleeps.
	waits() bool
	// ready reports whether a message could go out now.
	ready(c *consumer, now time.Time) bool
	// route says where the next message goes, its size counted as nats-server counts it
	// for that destination; ok is false when nothing can take it.
	route(c *consumer, subject string, size int, now time.Time) (to deliveryTarget, sized int, ok bool)
	// sent accounts a delivery of size bytes to to.
	sent(c *consumer, to deliveryTarget, size int, now time.Time)
	// sweep drops what expired or lost its client before a pump delivers.
	sweep(c *consumer, now time.Time)
	// settle ends a pump: eos says whether it ran out of messages to deliver.
	settle(c *consumer, now time.Time, eos bool)
	// wake calls earlier with each time the consumer must look again without being
	// signalled.
	wake(c *consumer, now time.Time, earlier func(time.Time))
	// inactive reports, once the inactive threshold passed, whether nothing holds the
	// consumer: no request waits, or no client listens on the deliver subject.
	inactive(c *consumer, now time.Time) bool
	// readSize is how many messages a read from PostgreSQL fetches for it.
	readSize() int
	// prefetchLow is how few read-ahead messages start the read of the next batch.
	prefetchLow() int
	// yieldEvery is how many deliveries a pump queues between two yields of its processor.
	yieldEvery() int
	// configure applies an update, keeping what is owed and paced.
	configure(c *consumer, cfg *server.ConsumerConfig, now time.Time) deliveryStrategy
	// numWaiting is nats-server's num_waiting: the requests waiting that have not expired.
	numWaiting(now time.Time) int
	// stopped answers whoever waits as a consumer stopping for hdr's reason; nil answers
	// nobody.
	stopped(c *consumer, hdr []byte)
}

// deliveryTarget is where one delivery goes: a waiting request's inbox, or a deliver subject and
// its group.
type deliveryTarget struct {
	subject, group string
	req            *pullRequest // nil for a push consumer
}

// newDelivery is the delivery cfg asks for.
func newDelivery(c *consumer, cfg *server.ConsumerConfig, now time.Time) deliveryStrategy {
	if cfg.DeliverSubject == "" {
		return &puller{}
	}
	return newPusher(c, cfg, now)
}

// puller delivers to the pull requests waiting at a pull consumer, in turn.
type puller struct {
	reqs []*pullRequest
}

// pullRequest is one waiting MSG.NEXT request. batch and maxBytes count down as messages go
// out; a request is done when batch reaches zero.
type pullRequest struct {
	reply    string
	batch    int
	maxBytes int       // bytes still allowed; 0 means no limit
	expires  time.Time // zero: no expiry
	noWait   bool
	hb       time.Duration
	hbNext   time.Time
	received time.Time
	sent     int  // messages delivered to it so far
	seen     bool // its inbox had a subscriber once, so losing it means the client left
	// seenAt is the link's interest version when the inbox last had a subscriber: until
	// the version moves it still has, and a delivery need not look again.
	seenAt uint64
}

// newPullRequest is a decoded request, received at now, as it starts to wait.
func newPullRequest(r jswire.PullRequest, now time.Time) pullRequest {
	pr := pullRequest{batch: r.Batch, maxBytes: r.MaxBytes, expires: r.Expires, noWait: r.NoWait, received: now}
	if r.Heartbeat > 0 {
		pr.hb = r.Heartbeat
		pr.hbNext = now.Add(r.Heartbeat)
	}
	return pr
}

// pendingHeader is a status carrying what was left of a request.
func pendingHeader(code int, desc string, pr *pullRequest) []byte {
	return jswire.PendingStatus(code, desc, pr.batch, pr.maxBytes)
}

// request queues a pull request, or answers it at once when JetStream would.
func (p *puller) request(c *consumer, reply string, body []byte, now time.Time) {
	link := c.cs.link
	req, bad := jswire.DecodePullRequest(body, now)
	if bad == nil {
		bad = jswire.CheckPullLimits(&c.cfg, &req, now)
	}
	if bad != nil {
		_ = link.Publish(reply, "", jswire.StatusHeader(bad.Code, bad.Desc), nil)
		return
	}
	pr := newPullRequest(req, now)
	c.lastActive = now
	if len(p.reqs) >= c.cfg.MaxWaiting {
		p.expire(c, now, false)
	}
	if len(p.reqs) >= c.cfg.MaxWaiting {
		// A client with heartbeats retries on its own; answering would make it spin.
		if pr.hb == 0 {
			_ = link.Publish(reply, "", jswire.StatusHeader(409, jswire.DescMaxWaiting), nil)
		}
		return
	}
	if pr.noWait {
		if pr.expires.IsZero() && !c.hasWork() {
			_ = link.Publish(reply, "", jswire.StatusHeader(404, jswire.DescNoMessages), nil)
			return
		}
		// As nats-server does: a one-shot request that the messages there are cannot serve
		// beyond what the requests already waiting will take is told so at once rather than
		// left to wait behind them.
		if pending := c.msgsPending(); pending > 0 {
			p.expire(c, now, false)
			if pending < p.batchPending() {
				_ = link.Publish(reply, "", jswire.StatusHeader(408, jswire.DescRequestsPend), nil)
				return
			}
		}
	}
	pr.reply = reply
	pr.seen = link.HasInterest(reply)
	p.reqs = append(p.reqs, &pr)
	c.cs.m.Pulls.Inc()
}

// batchPending is how many messages the waiting requests still want.
func (p *puller) batchPending() int64 {
	var n int64
	for _, wr := range p.reqs {
		n += int64(wr.batch)
	}
	return n
}

func (p *puller) waits() bool { return len(p.reqs) > 0 }

func (p *puller) ready(*consumer, time.Time) bool { return len(p.reqs) > 0 }

// route picks the request the next message goes to, dropping those that expired, cannot
// take it, or lost their subscriber. The request stays at the head until sent moves it.
func (p *puller) route(c *consumer, _ string, size int, now time.Time) (deliveryTarget, int, bool) {
	link := c.cs.link
	for len(p.reqs) > 0 {
		wr := p.reqs[0]
		switch {
		case !wr.expires.IsZero() && !now.Before(wr.expires):
			_ = link.Publish(wr.reply, "", pendingHeader(408, jswire.DescRequestTimeout, wr), nil)
			c.lastActive = now
		case wr.maxBytes > 0 && size > wr.maxBytes:
			_ = link.Publish(wr.reply, "", pendingHeader(409, jswire.DescMaxBytes, wr), nil)
		case !p.hasInterest(c, wr, now):
		default:
			return deliveryTarget{subject: wr.reply, req: wr}, size, true
		}
		p.reqs = p.reqs[1:]
	}
	p.reqs = nil
	return deliveryTarget{}, size, false
}

// hasInterest reports whether the request's inbox still has a subscriber (see interestGrace).
func (p *puller) hasInterest(c *consumer, wr *pullRequest, now time.Time) bool {
	link := c.cs.link
	v := link.InterestVersion()
	if wr.seen && wr.seenAt == v {
		return true
	}
	if link.HasInterest(wr.reply) {
		wr.seen, wr.seenAt = true, v
		return true
	}
	return !wr.seen && now.Sub(wr.received) < interestGrace
}

// sent counts a message against the request at the head of the queue. A request with more
// to take moves to the back, so that several clients share a consumer in turn.
func (p *puller) sent(c *consumer, to deliveryTarget, size int, now time.Time) {
	wr := to.req
	if wr.sent == 0 {
		c.cs.m.SubLatency.Observe(now.Sub(wr.received).Seconds())
	}
	wr.sent++
	wr.batch--
	if wr.maxBytes > 0 {
		wr.maxBytes -= size
		if wr.maxBytes == 0 {
			wr.batch = 0
		}
	}
	p.reqs = p.reqs[1:]
	if wr.batch <= 0 {
		if wr.maxBytes > 0 {
			_ = c.cs.link.Publish(wr.reply, "", pendingHeader(409, jswire.DescBatchCompleted, wr), nil)
		}
		return
	}
	if wr.hb > 0 {
		wr.hbNext = now.Add(wr.hb)
	}
	p.reqs = append(p.reqs, wr)
}

func (p *puller) sweep(c *consumer, now time.Time) { p.expire(c, now, false) }

func (p *puller) settle(c *consumer, now time.Time, eos bool) { p.expire(c, now, eos) }

// expire expires requests (408), ends no-wait requests once nothing is left to deliver
// (eos), drops requests whose inbox went away, and sends due heartbeats.
func (p *puller) expire(c *consumer, now time.Time, eos bool) {
	link := c.cs.link
	kept := p.reqs[:0]
	for _, wr := range p.reqs {
		switch {
		case !wr.expires.IsZero() && !now.Before(wr.expires):
			_ = link.Publish(wr.reply, "", pendingHeader(408, jswire.DescRequestTimeout, wr), nil)
			c.lastActive = now
			continue
		case eos && wr.noWait && (wr.expires.IsZero() || wr.sent > 0):
			_ = link.Publish(wr.reply, "", jswire.StatusHeader(404, jswire.DescNoMessages), nil)
			c.lastActive = now
			continue
		case !p.hasInterest(c, wr, now):
			continue
		}
		if wr.hb > 0 && !now.Before(wr.hbNext) {
			d := c.st.Delivered()
			_ = link.Publish(wr.reply, "", jswire.HeartbeatStatus(d.Consumer, d.Stream), nil)
			wr.hbNext = now.Add(wr.hb)
		}
		kept = append(kept, wr)
	}
	clear(p.reqs[len(kept):])
	p.reqs = kept
}

// wake: a request expiring or due a heartbeat, a retry of a failed read, an interest sweep
// while requests wait; the inactive threshold while none does.
func (p *puller) wake(c *consumer, now time.Time, earlier func(time.Time)) {
	if len(p.reqs) == 0 {
		if th := c.cfg.InactiveThreshold; th > 0 {
			earlier(c.lastActive.Add(th))
		}
		return
	}
	for _, wr := range p.reqs {
		earlier(wr.expires)
		if wr.hb > 0 {
			earlier(wr.hbNext)
		}
	}
	earlier(now.Add(interestSweep))
	if c.retryAt.After(now) {
		earlier(c.retryAt)
	}
	if c.paused(now) {
		earlier(*c.cfg.PauseUntil)
	}
}

func (p *puller) inactive(*consumer, time.Time) bool { return len(p.reqs) == 0 }

// readSize is what the waiting requests want, within the read-ahead's bounds.
func (p *puller) readSize() int {
	return int(min(max(p.batchPending(), readAheadMin), readAheadMax))
}

// prefetchLow: a pull consumer starts the next read once half the read-ahead went.
func (p *puller) prefetchLow() int { return prefetchBelow }

func (p *puller) yieldEvery() int { return deliveryYield }

func (p *puller) configure(*consumer, *server.ConsumerConfig, time.Time) deliveryStrategy { return p }

func (p *puller) stopped(c *consumer, hdr []byte) {
	if hdr != nil {
		for _, wr := range p.reqs {
			_ = c.cs.link.Publish(wr.reply, "", hdr, nil)
		}
	}
	p.reqs = nil
}

func (p *puller) numWaiting(now time.Time) int {
	n := 0
	for _, wr := range p.reqs {
		if wr.expires.IsZero() || now.Before(wr.expires) {
			n++
		}
	}
	return n
}
