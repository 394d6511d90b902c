package pullqueue

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// routeOne routes one message of 10 bytes and accounts it, returning the inbox it went to,
// or "" when no request may take it.
func routeOne(q *Queue, h *fakeQueueHost, now time.Time) string {
	r := q.Route(h, 10, false, now)
	if r == nil {
		return ""
	}
	q.Sent(h, r, 10, now)
	return r.Reply()
}

func TestPriorityRequestFieldsChecked(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name string
		cfg  server.ConsumerConfig
		body string
		want string
	}{
		{"min_pending without overflow", server.ConsumerConfig{}, `{"batch":1,"min_pending":5}`, "400 Bad Request - Not a Overflow Priority consumer"},
		{"pin id without pinned policy", server.ConsumerConfig{PriorityPolicy: server.PriorityOverflow, PriorityGroups: []string{"A"}}, `{"batch":1,"group":"A","id":"x"}`, "400 Bad Request - Not a Pinned Client Priority consumer"},
		{"priority out of range", server.ConsumerConfig{}, `{"batch":1,"priority":10}`, "400 Bad Request - Priority must be between 0 and 9"},
		{"group missing", server.ConsumerConfig{PriorityPolicy: server.PriorityPinnedClient, PriorityGroups: []string{"A"}}, `{"batch":1}`, "400 Bad Request - Priority Group missing"},
		{"unknown group", server.ConsumerConfig{PriorityPolicy: server.PriorityPinnedClient, PriorityGroups: []string{"A"}}, `{"batch":1,"group":"B"}`, "400 Bad Request - Invalid Priority Group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.MaxWaiting = 10
			h := &fakeQueueHost{cfg: tc.cfg}
			var q Queue
			q.Add(h, "in", []byte(tc.body), now)
			if got := h.lastAnswer(); got != "in NATS/1.0 "+tc.want || q.Waits() {
				t.Fatalf("answered %q (waits %v), want %q", got, q.Waits(), tc.want)
			}
		})
	}
}

func TestOverflowServesOnlyPastItsThresholds(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := &fakeQueueHost{cfg: server.ConsumerConfig{MaxWaiting: 10, PriorityPolicy: server.PriorityOverflow, PriorityGroups: []string{"A"}}}
	var q Queue
	q.Add(h, "in.over", []byte(`{"batch":10,"group":"A","min_pending":5}`), now)
	q.Add(h, "in.acks", []byte(`{"batch":10,"group":"A","min_ack_pending":3}`), now)
	h.numPend, h.ackPend = 4, 2
	if got := routeOne(&q, h, now); got != "" {
		t.Fatalf("below both thresholds a message went to %q", got)
	}
	if r := q.Route(h, 10, true, now); r == nil || r.Reply() != "in.over" {
		t.Fatalf("a redelivery with 4 never delivered went to %v, want in.over (it counts one more)", r)
	}
	h.numPend = 5
	if got := routeOne(&q, h, now); got != "in.over" {
		t.Fatalf("at min_pending the message went to %q, want in.over", got)
	}
	h.numPend, h.ackPend = 1, 3
	if got := routeOne(&q, h, now); got != "in.acks" {
		t.Fatalf("at min_ack_pending the message went to %q, want in.acks", got)
	}
	q.Add(h, "in.plain", []byte(`{"batch":1,"group":"A"}`), now)
	h.ackPend = 0
	if got := routeOne(&q, h, now); got != "in.plain" {
		t.Fatalf("a request without thresholds did not take the message: %q", got)
	}
}

func TestPinnedClientKeepsThePinUntilItsTTL(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	cfg := server.ConsumerConfig{MaxWaiting: 10, PriorityPolicy: server.PriorityPinnedClient, PriorityGroups: []string{"A"}, PinnedTTL: 10 * time.Second}
	h := &fakeQueueHost{cfg: cfg}
	var q Queue
	q.Add(h, "in.a", []byte(`{"batch":10,"group":"A","expires":60000000000}`), now)
	q.Add(h, "in.b", []byte(`{"batch":10,"group":"A","expires":60000000000}`), now)
	if got := routeOne(&q, h, now); got != "in.a" {
		t.Fatalf("first delivery went to %q, want in.a", got)
	}
	pin, pinned := q.PinID(&h.cfg, now)
	if !pinned || pin == "" {
		t.Fatalf("no pin after the first delivery: %q %v", pin, pinned)
	}
	for range 3 {
		if got := routeOne(&q, h, now); got != "in.a" {
			t.Fatalf("a delivery went to %q while in.a holds the pin", got)
		}
	}
	q.Add(h, "in.c", []byte(`{"batch":1,"group":"A","id":"stale"}`), now)
	if got := h.lastAnswer(); got != "in.c NATS/1.0 423 Nats-Pin-Id mismatch" {
		t.Fatalf("a request with another pin got %q", got)
	}
	// The pinned client asks again, which renews the pin.
	later := now.Add(8 * time.Second)
	q.Add(h, "in.a2", []byte(`{"batch":1,"group":"A","expires":60000000000,"id":"`+pin+`"}`), later)
	var woken []time.Time
	q.Wake(later, func(at time.Time) { woken = append(woken, at) })
	if want := later.Add(10 * time.Second); !strings.Contains(strings.Join(timesOf(woken), " "), want.String()) {
		t.Fatalf("wake times %v do not include the pin's lapse at %v", woken, want)
	}
	st := q.PriorityGroups(&h.cfg, later)
	if len(st) != 1 || st[0].Group != "A" || st[0].PinnedClientID != pin || !st[0].PinnedTS.Equal(now.UTC()) {
		t.Fatalf("priority groups %+v, want A pinned to %s since %v", st, pin, now)
	}
	// The pin lapses: the next message pins the first request without it, and the waiting
	// requests that carry the old one are dropped with a 423.
	lapsed := later.Add(10 * time.Second)
	for range 2 {
		if got := routeOne(&q, h, lapsed); got != "in.b" {
			t.Fatalf("after the pin lapsed a message went to %q, want in.b", got)
		}
	}
	if got := strings.Join(h.answers, ","); !strings.Contains(got, "in.a NATS/1.0 423 Nats-Wrong-Pin-Id") || !strings.Contains(got, "in.a2 NATS/1.0 423 Nats-Wrong-Pin-Id") {
		t.Fatalf("the old pin's request was not dropped: %q", got)
	}
	if pin2, _ := q.PinID(&h.cfg, lapsed); pin2 == "" || pin2 == pin {
		t.Fatalf("pin after lapse %q, want a new one (old %q)", pin2, pin)
	}
	q.Unpin()
	if st := q.PriorityGroups(&h.cfg, lapsed); st[0].PinnedClientID != "" || !st[0].PinnedTS.IsZero() {
		t.Fatalf("after unpin: %+v", st)
	}
}

func TestPrioritizedServesTheLowestPriorityFirst(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := &fakeQueueHost{cfg: server.ConsumerConfig{MaxWaiting: 10, PriorityPolicy: server.PriorityPrioritized, PriorityGroups: []string{"A"}}}
	var q Queue
	q.Add(h, "in.p5", []byte(`{"batch":2,"group":"A","priority":5}`), now)
	q.Add(h, "in.p1", []byte(`{"batch":2,"group":"A","priority":1}`), now)
	q.Add(h, "in.p1b", []byte(`{"batch":1,"group":"A","priority":1}`), now)
	var got []string
	for r := routeOne(&q, h, now); r != ""; r = routeOne(&q, h, now) {
		got = append(got, r)
	}
	if want := "in.p1 in.p1b in.p1 in.p5 in.p5"; strings.Join(got, " ") != want {
		t.Fatalf("delivered to %q, want %q", strings.Join(got, " "), want)
	}
}

func timesOf(ts []time.Time) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.String()
	}
	return out
}
