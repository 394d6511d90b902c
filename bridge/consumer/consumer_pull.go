package consumer

import (
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/pullqueue"
	"github.com/jetgres/jetgres/bridge/consumerstate"
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
	// route says where the next message goes (redelivered or new), its size counted as
	// nats-server counts it for that destination; ok is false when nothing can take it.
	route(c *consumer, subject string, size int, redelivered bool, now time.Time) (to deliveryTarget, sized int, ok bool)
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
// its group. A pinned_client consumer's deliveries carry its pin (pinned).
type deliveryTarget struct {
	subject, group string
	req            *pullqueue.WaitingRequest // nil for a push consumer
	pin            string
	pinned         bool
}

// newDelivery is the delivery cfg asks for.
func newDelivery(c *consumer, cfg *server.ConsumerConfig, now time.Time) deliveryStrategy {
	if cfg.DeliverSubject == "" {
		return &puller{}
	}
	return newPusher(c, cfg, now)
}

// puller delivers to the pull requests waiting at a pull consumer, in turn (see
// bridge/consumer/pullqueue).
type puller struct {
	q pullqueue.Queue
}

// pullHost is what a pull consumer's queue asks of the consumer and its link.
type pullHost struct{ c *consumer }

func (h pullHost) Publish(subject, reply string, hdr, data []byte) error {
	return h.c.cs.link.Publish(subject, reply, hdr, data)
}
func (h pullHost) HasInterest(subject string) bool { return h.c.cs.link.HasInterest(subject) }
func (h pullHost) InterestVersion() uint64         { return h.c.cs.link.InterestVersion() }
func (h pullHost) Config() *server.ConsumerConfig  { return &h.c.cfg }
func (h pullHost) Touch(now time.Time)             { h.c.lastActive = now }
func (h pullHost) HasWork() bool                   { return h.c.hasWork() }
func (h pullHost) MsgsPending() int64              { return h.c.msgsPending() }
func (h pullHost) Pending() (int64, int)           { return max(h.c.npc, 0), h.c.st.NumAckPending() }
func (h pullHost) Delivered() consumerstate.Pair   { return h.c.st.Delivered() }
func (h pullHost) Queued()                         { h.c.cs.m.Pulls.Inc() }
func (h pullHost) FirstSent(waited time.Duration)  { h.c.cs.m.SubLatency.Observe(waited.Seconds()) }

// request queues a pull request, or answers it at once when JetStream would.
func (p *puller) request(c *consumer, reply string, body []byte, now time.Time) {
	p.q.Add(pullHost{c}, reply, body, now)
}

func (p *puller) waits() bool { return p.q.Waits() }

func (p *puller) ready(*consumer, time.Time) bool { return p.q.Waits() }

// route picks the request the next message goes to.
func (p *puller) route(c *consumer, _ string, size int, redelivered bool, now time.Time) (deliveryTarget, int, bool) {
	r := p.q.Route(pullHost{c}, size, redelivered, now)
	if r == nil {
		return deliveryTarget{}, size, false
	}
	pin, pinned := p.q.PinID(&c.cfg, now)
	return deliveryTarget{subject: r.Reply(), req: r, pin: pin, pinned: pinned}, size, true
}

func (p *puller) sent(c *consumer, to deliveryTarget, size int, now time.Time) {
	p.q.Sent(pullHost{c}, to.req, size, now)
}

func (p *puller) sweep(c *consumer, now time.Time) { p.q.Expire(pullHost{c}, now, false) }

func (p *puller) settle(c *consumer, now time.Time, eos bool) { p.q.Expire(pullHost{c}, now, eos) }

// wake: a request expiring or due a heartbeat, a retry of a failed read, an interest sweep
// while requests wait; the inactive threshold while none does.
func (p *puller) wake(c *consumer, now time.Time, earlier func(time.Time)) {
	if !p.q.Waits() {
		if th := c.cfg.InactiveThreshold; th > 0 {
			earlier(c.lastActive.Add(th))
		}
		return
	}
	p.q.Wake(now, earlier)
	if c.retryAt.After(now) {
		earlier(c.retryAt)
	}
	if c.paused(now) {
		earlier(*c.cfg.PauseUntil)
	}
}

func (p *puller) inactive(*consumer, time.Time) bool { return !p.q.Waits() }

// readSize is what the waiting requests want, within the read-ahead's bounds.
func (p *puller) readSize() int {
	return int(min(max(p.q.BatchPending(), readAheadMin), readAheadMax))
}

// prefetchLow: a pull consumer starts the next read once half the read-ahead went.
func (p *puller) prefetchLow() int { return prefetchBelow }

func (p *puller) yieldEvery() int { return deliveryYield }

func (p *puller) configure(*consumer, *server.ConsumerConfig, time.Time) deliveryStrategy { return p }

func (p *puller) stopped(c *consumer, hdr []byte) { p.q.Stopped(pullHost{c}, hdr) }

func (p *puller) numWaiting(now time.Time) int { return p.q.NumWaiting(now) }
