package pullqueue

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumerstate"
)

// fakeQueueHost records what a Queue answers; every inbox has a subscriber unless gone says not.
type fakeQueueHost struct {
	cfg      server.ConsumerConfig
	work     bool
	pending  int64
	numPend  int64
	ackPend  int
	gone     map[string]bool
	answers  []string // inbox and status line of each answer
	queued   int
	touched  time.Time
	firstFor []time.Duration
}

func (h *fakeQueueHost) Publish(subject, _ string, hdr, _ []byte) error {
	status, _, _ := strings.Cut(string(hdr), "\r\n")
	h.answers = append(h.answers, subject+" "+status)
	return nil
}
func (h *fakeQueueHost) HasInterest(subject string) bool { return !h.gone[subject] }
func (h *fakeQueueHost) InterestVersion() uint64         { return uint64(len(h.gone)) }
func (h *fakeQueueHost) Config() *server.ConsumerConfig  { return &h.cfg }
func (h *fakeQueueHost) Touch(now time.Time)             { h.touched = now }
func (h *fakeQueueHost) HasWork() bool                   { return h.work }
func (h *fakeQueueHost) MsgsPending() int64              { return h.pending }
func (h *fakeQueueHost) Pending() (int64, int)           { return h.numPend, h.ackPend }
func (h *fakeQueueHost) Delivered() consumerstate.Pair   { return consumerstate.Pair{} }
func (h *fakeQueueHost) Queued()                         { h.queued++ }
func (h *fakeQueueHost) FirstSent(waited time.Duration)  { h.firstFor = append(h.firstFor, waited) }
func (h *fakeQueueHost) lastAnswer() string              { return h.answers[len(h.answers)-1] }

func TestRequestsServedInTurnUntilTheirBatchEnds(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := &fakeQueueHost{cfg: server.ConsumerConfig{MaxWaiting: 2}, work: true}
	var q Queue
	q.Add(h, "in.a", []byte("2"), now)
	q.Add(h, "in.b", []byte("1"), now)
	q.Add(h, "in.c", []byte("1"), now)
	if h.queued != 2 || h.lastAnswer() != "in.c NATS/1.0 409 Exceeded MaxWaiting" {
		t.Fatalf("queued %d, answers %q; want 2 and in.c refused", h.queued, h.answers)
	}
	if q.BatchPending() != 3 || q.NumWaiting(now) != 2 {
		t.Fatalf("batch pending %d, waiting %d; want 3 and 2", q.BatchPending(), q.NumWaiting(now))
	}
	var got []string
	for r := q.Route(h, 10, false, now); r != nil; r = q.Route(h, 10, false, now) {
		got = append(got, r.Reply())
		q.Sent(h, r, 10, now.Add(time.Millisecond))
	}
	if want := "in.a in.b in.a"; strings.Join(got, " ") != want {
		t.Fatalf("delivered to %q, want %q", got, want)
	}
	if len(h.firstFor) != 2 || h.firstFor[0] != time.Millisecond {
		t.Fatalf("first-message waits %v, want two of 1ms", h.firstFor)
	}
	if q.Waits() {
		t.Fatal("requests wait after their batches ended")
	}
}

func TestNoWaitExpiryAndLostInboxes(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := &fakeQueueHost{cfg: server.ConsumerConfig{MaxWaiting: 10}, gone: map[string]bool{}}
	var q Queue
	q.Add(h, "in.nowait", []byte(`{"batch":1,"no_wait":true}`), now)
	if h.lastAnswer() != "in.nowait NATS/1.0 404 No Messages" || q.Waits() {
		t.Fatalf("a no-wait request with nothing to deliver got %q", h.answers)
	}
	q.Add(h, "in.exp", []byte(`{"batch":5,"expires":1000000000}`), now)
	q.Add(h, "in.left", []byte("1"), now)
	h.gone["in.left"] = true
	q.Expire(h, now.Add(time.Second), false)
	if h.lastAnswer() != "in.exp NATS/1.0 408 Request Timeout" || q.Waits() {
		t.Fatalf("after expiry: answers %q, waits %v", h.answers, q.Waits())
	}
	if !h.touched.Equal(now.Add(time.Second)) {
		t.Fatal("an expired request did not count as client activity")
	}
	var woken []time.Time
	q.Add(h, "in.hb", []byte(`{"batch":1,"expires":10000000000,"idle_heartbeat":1000000000}`), now)
	q.Wake(now, func(at time.Time) { woken = append(woken, at) })
	if len(woken) != 3 || !woken[0].Equal(now.Add(10*time.Second)) || !woken[1].Equal(now.Add(time.Second)) {
		t.Fatalf("wake times %v, want expiry, heartbeat and sweep", woken)
	}
	q.Expire(h, now.Add(time.Second), false)
	if !strings.HasPrefix(h.lastAnswer(), "in.hb NATS/1.0 100 Idle Heartbeat") {
		t.Fatalf("no heartbeat when due: %q", h.lastAnswer())
	}
	q.Stopped(h, []byte("NATS/1.0 409 Consumer Deleted\r\n\r\n"))
	if h.lastAnswer() != "in.hb NATS/1.0 409 Consumer Deleted" || q.Waits() {
		t.Fatalf("stopping answered %q", h.answers)
	}
}
