// Package pullqueue is a pull consumer's queue of waiting MSG.NEXT requests, as
// nats-server's waiting queue behaves: which requests are taken, refused (409, 408) or
// answered at once (404), which one the next message goes to, how batches and byte limits
// count down, when requests expire, lose their client or are due a heartbeat. The consumer
// engine (bridge/consumer) owns a Queue per pull consumer and calls it from the consumer's
// goroutine; the Queue reaches the link and the consumer through a QueueHost. A consumer
// with priority groups keeps its pin in its Queue, which asks bridge/consumer/priority
// which request may take a message.
//
// # Locks
//
// It has none: a Queue belongs to its consumer's goroutine, which holds the consumer's
// lock while it calls it. Its answers go out on the link with that lock held, as every
// delivery does.
package pullqueue

import (
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/priority"
	"github.com/jetgres/jetgres/bridge/consumerstate"
	"github.com/jetgres/jetgres/internal/jswire"
)

const (
	// interestGrace is how long a request whose inbox the server never announced to the link
	// counts as having a subscriber anyway. The server announces an inbox before it forwards
	// a request sent after subscribing to it, so this only covers requests relayed from
	// elsewhere; a request whose inbox was announced once is dropped as soon as it is not.
	interestGrace = time.Second
	// interestSweep bounds how long a request whose inbox went away stays queued (and counts
	// against max_waiting) when neither its expiry nor a heartbeat comes sooner. Deliveries
	// do not wait for it: each one checks the inbox first.
	interestSweep = time.Second
)

// QueueHost is what a Queue asks of its link and its consumer.
type QueueHost interface {
	// Publish, HasInterest and InterestVersion are the link's.
	Publish(subject, reply string, hdr, data []byte) error
	HasInterest(subject string) bool
	InterestVersion() uint64
	// Config is the consumer's configuration.
	Config() *server.ConsumerConfig
	// Touch says a client was active at now: the inactive threshold counts from there.
	Touch(now time.Time)
	// HasWork reports whether anything is deliverable without asking PostgreSQL, and
	// MsgsPending nats-server's count of what a no-wait request could get.
	HasWork() bool
	MsgsPending() int64
	// Pending is what an overflow consumer compares a request's min_pending and
	// min_ack_pending with: the messages never delivered (a new one about to go out
	// included) and those waiting for an ack.
	Pending() (num int64, ack int)
	// Delivered is the consumer's last delivery, which heartbeats report.
	Delivered() consumerstate.Pair
	// Queued counts a request taken into the queue; FirstSent observes how long a request
	// waited for its first message.
	Queued()
	FirstSent(waited time.Duration)
}

// WaitingRequest is one waiting MSG.NEXT request. batch and maxBytes count down as
// messages go out; a request is done when batch reaches zero.
type WaitingRequest struct {
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
	group  *server.PriorityGroup // the request's priority fields, nil when it is not JSON
}

// Reply is the request's inbox, where its messages go.
func (r *WaitingRequest) Reply() string { return r.reply }

// newRequest is a decoded request, received at now, as it starts to wait.
func newRequest(r jswire.PullRequest, now time.Time) WaitingRequest {
	pr := WaitingRequest{batch: r.Batch, maxBytes: r.MaxBytes, expires: r.Expires, noWait: r.NoWait, received: now, group: r.Group}
	if r.Heartbeat > 0 {
		pr.hb = r.Heartbeat
		pr.hbNext = now.Add(r.Heartbeat)
	}
	return pr
}

// pendingHeader is a status carrying what was left of a request.
func pendingHeader(code int, desc string, r *WaitingRequest) []byte {
	return jswire.PendingStatus(code, desc, r.batch, r.maxBytes)
}

// Queue is the requests waiting at a pull consumer, served in turn.
type Queue struct {
	reqs []*WaitingRequest
	pin  priority.Pin
}

// Add queues a pull request, or answers it at once when JetStream would.
func (q *Queue) Add(h QueueHost, reply string, body []byte, now time.Time) {
	cfg := h.Config()
	req, bad := jswire.DecodePullRequest(body, now)
	if bad == nil {
		bad = jswire.CheckPullLimits(cfg, &req, now)
	}
	if bad == nil {
		bad = priority.Check(cfg, req.Group)
	}
	if bad == nil {
		bad = q.pin.Admit(cfg, req.Group, now)
	}
	if bad != nil {
		_ = h.Publish(reply, "", jswire.StatusHeader(bad.Code, bad.Desc), nil)
		return
	}
	pr := newRequest(req, now)
	h.Touch(now)
	if len(q.reqs) >= cfg.MaxWaiting {
		q.Expire(h, now, false)
	}
	if len(q.reqs) >= cfg.MaxWaiting {
		// A client with heartbeats retries on its own; answering would make it spin.
		if pr.hb == 0 {
			_ = h.Publish(reply, "", jswire.StatusHeader(409, jswire.DescMaxWaiting), nil)
		}
		return
	}
	if pr.noWait {
		if pr.expires.IsZero() && !h.HasWork() {
			_ = h.Publish(reply, "", jswire.StatusHeader(404, jswire.DescNoMessages), nil)
			return
		}
		// As nats-server does: a one-shot request that the messages there are cannot serve
		// beyond what the requests already waiting will take is told so at once rather than
		// left to wait behind them.
		if pending := h.MsgsPending(); pending > 0 {
			q.Expire(h, now, false)
			if pending < q.BatchPending() {
				_ = h.Publish(reply, "", jswire.StatusHeader(408, jswire.DescRequestsPend), nil)
				return
			}
		}
	}
	pr.reply = reply
	pr.seen = h.HasInterest(reply)
	q.enqueue(cfg, &pr)
	h.Queued()
}

// enqueue puts r at the back of the queue, or for a prioritized consumer behind the
// requests of its priority and those before it.
func (q *Queue) enqueue(cfg *server.ConsumerConfig, r *WaitingRequest) {
	if cfg.PriorityPolicy != server.PriorityPrioritized {
		q.reqs = append(q.reqs, r)
		return
	}
	level := priority.Level(r.group)
	i := len(q.reqs)
	for i > 0 && priority.Level(q.reqs[i-1].group) > level {
		i--
	}
	q.reqs = slices.Insert(q.reqs, i, r)
}

// BatchPending is how many messages the waiting requests still want.
func (q *Queue) BatchPending() int64 {
	var n int64
	for _, r := range q.reqs {
		n += int64(r.batch)
	}
	return n
}

// Waits reports whether any request waits.
func (q *Queue) Waits() bool { return len(q.reqs) > 0 }

// Route picks the request a message of size bytes goes to, dropping those that expired,
// cannot take it, lost their subscriber, or name a pin no longer current; nil when none
// is left or none of those left may take it (priority groups), which then wait on in the
// order they were looked at, as nats-server cycles them. The request stays at the head
// until Sent moves it.
//
// A redelivered message counts one more towards min_pending than the messages never
// delivered, as nats-server counts it (its count of those, plus one, for any message).
func (q *Queue) Route(h QueueHost, size int, redelivered bool, now time.Time) *WaitingRequest {
	cfg := h.Config()
	needPin := q.pin.Needed(cfg, now)
	cycled := 0
	for len(q.reqs) > 0 {
		r := q.reqs[0]
		if !r.expires.IsZero() && !now.Before(r.expires) {
			_ = h.Publish(r.reply, "", pendingHeader(408, jswire.DescRequestTimeout, r), nil)
			h.Touch(now)
			q.reqs = q.reqs[1:]
			continue
		}
		num, ack := h.Pending()
		if redelivered {
			num++
		}
		v, assigned := q.pin.Pick(cfg, r.group, needPin, num, ack, now)
		switch {
		case v == priority.Skip:
			q.reqs = append(q.reqs[1:], r)
			if cycled++; cycled >= len(q.reqs) {
				return nil
			}
			continue
		case v == priority.WrongPin:
			_ = h.Publish(r.reply, "", pendingHeader(423, priority.DescWrongPin, r), nil)
		case r.maxBytes > 0 && size > r.maxBytes:
			_ = h.Publish(r.reply, "", pendingHeader(409, jswire.DescMaxBytes, r), nil)
			if assigned {
				q.pin.Release()
			}
		case !hasInterest(h, r, now):
		default:
			return r
		}
		q.reqs = q.reqs[1:]
	}
	q.reqs = nil
	return nil
}

// hasInterest reports whether the request's inbox still has a subscriber (see interestGrace).
func hasInterest(h QueueHost, r *WaitingRequest, now time.Time) bool {
	v := h.InterestVersion()
	if r.seen && r.seenAt == v {
		return true
	}
	if h.HasInterest(r.reply) {
		r.seen, r.seenAt = true, v
		return true
	}
	return !r.seen && now.Sub(r.received) < interestGrace
}

// Sent counts a message of size bytes against r, the request at the head of the queue. A
// request with more to take moves to the back, so that several clients share a consumer in
// turn.
func (q *Queue) Sent(h QueueHost, r *WaitingRequest, size int, now time.Time) {
	if r.sent == 0 {
		h.FirstSent(now.Sub(r.received))
	}
	r.sent++
	r.batch--
	if r.maxBytes > 0 {
		r.maxBytes -= size
		if r.maxBytes == 0 {
			r.batch = 0
		}
	}
	q.reqs = q.reqs[1:]
	if r.batch <= 0 {
		if r.maxBytes > 0 {
			_ = h.Publish(r.reply, "", pendingHeader(409, jswire.DescBatchCompleted, r), nil)
		}
		return
	}
	if r.hb > 0 {
		r.hbNext = now.Add(r.hb)
	}
	q.enqueue(h.Config(), r)
}

// Expire expires requests (408), ends no-wait requests once nothing is left to deliver
// (eos), drops requests whose inbox went away, and sends due heartbeats.
func (q *Queue) Expire(h QueueHost, now time.Time, eos bool) {
	kept := q.reqs[:0]
	for _, r := range q.reqs {
		switch {
		case !r.expires.IsZero() && !now.Before(r.expires):
			_ = h.Publish(r.reply, "", pendingHeader(408, jswire.DescRequestTimeout, r), nil)
			h.Touch(now)
			continue
		case eos && r.noWait && (r.expires.IsZero() || r.sent > 0):
			_ = h.Publish(r.reply, "", jswire.StatusHeader(404, jswire.DescNoMessages), nil)
			h.Touch(now)
			continue
		case !hasInterest(h, r, now):
			continue
		}
		if r.hb > 0 && !now.Before(r.hbNext) {
			d := h.Delivered()
			_ = h.Publish(r.reply, "", jswire.HeartbeatStatus(d.Consumer, d.Stream), nil)
			r.hbNext = now.Add(r.hb)
		}
		kept = append(kept, r)
	}
	clear(q.reqs[len(kept):])
	q.reqs = kept
}

// Wake calls earlier with each time a waiting request needs looking at: its expiry, its
// heartbeat, the interest sweep, and the lapse of a pin, which another may then take.
func (q *Queue) Wake(now time.Time, earlier func(time.Time)) {
	for _, r := range q.reqs {
		earlier(r.expires)
		if r.hb > 0 {
			earlier(r.hbNext)
		}
	}
	earlier(now.Add(interestSweep))
	if d := q.pin.Deadline(now); !d.IsZero() {
		earlier(d)
	}
}

// PinID is the header value of a delivery of a pinned_client consumer at now: the current
// pin; ok is false for any other policy.
func (q *Queue) PinID(cfg *server.ConsumerConfig, now time.Time) (id string, ok bool) {
	if cfg.PriorityPolicy != server.PriorityPinnedClient {
		return "", false
	}
	return q.pin.ID(now), true
}

// Unpin takes the pin away from the client holding it (CONSUMER.UNPIN).
func (q *Queue) Unpin() { q.pin.Unpin() }

// PriorityGroups is the consumer info's priority_groups at now.
func (q *Queue) PriorityGroups(cfg *server.ConsumerConfig, now time.Time) []server.PriorityGroupState {
	return priority.States(cfg, &q.pin, now)
}

// Stopped answers every waiting request with hdr, unless it is nil, and forgets them.
func (q *Queue) Stopped(h QueueHost, hdr []byte) {
	if hdr != nil {
		for _, r := range q.reqs {
			_ = h.Publish(r.reply, "", hdr, nil)
		}
	}
	q.reqs = nil
}

// NumWaiting is nats-server's num_waiting: the requests waiting that have not expired.
func (q *Queue) NumWaiting(now time.Time) int {
	n := 0
	for _, r := range q.reqs {
		if r.expires.IsZero() || now.Before(r.expires) {
			n++
		}
	}
	return n
}
