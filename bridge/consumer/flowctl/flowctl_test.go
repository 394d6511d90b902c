package flowctl

import (
	"testing"
	"time"
)

// The window asks past half of it, holds delivery once full, and doubles with each answer to
// the newest request, up to MaxWindow.
func TestWindow(t *testing.T) {
	w := New()
	start := MaxWindow / 16
	if w.Sent(start/2, false) {
		t.Fatal("asked at exactly half the window")
	}
	if !w.Sent(1, false) {
		t.Fatal("did not ask past half the window")
	}
	w.Requested("$JS.FC.S.C.aaaa")
	if w.Sent(start/2, false) || !w.Closed() {
		t.Fatal("a full window asked again or stayed open")
	}
	now := time.Unix(1_700_000_000, 0)
	if !w.Stall(now) || w.Stall(now.Add(time.Second)) {
		t.Fatal("a stall counted other than once")
	}
	if w.Answered("$JS.FC.S.C.bbbb") {
		t.Fatal("took an answer to another request")
	}
	if !w.Answered("$JS.FC.S.C.aaaa") || w.Closed() || w.Owed() != "" {
		t.Fatal("the answer did not open the window")
	}
	if w.Answered("$JS.FC.S.C.aaaa") {
		t.Fatal("took the same answer twice")
	}
	// What was sent after the request stays counted against the doubled window.
	if w.bytes != start/2 || w.max != 2*start {
		t.Fatalf("bytes %d of %d after the answer", w.bytes, w.max)
	}
	// Once the window passed the request owed, the request covers what is sent on.
	w.Requested("$JS.FC.S.C.dddd")
	w.Sent(2*start, false)
	w.Answered("$JS.FC.S.C.dddd")
	if w.bytes != 0 {
		t.Fatalf("bytes %d after answering a widened request", w.bytes)
	}
	for range 10 {
		w.Requested("$JS.FC.S.C.cccc")
		w.Answered("$JS.FC.S.C.cccc")
	}
	if w.max != MaxWindow {
		t.Fatalf("window %d, want MaxWindow", w.max)
	}
}

// Under the flow_control ack policy a request goes out at max_ack_pending however little
// was sent, and only one is owed at a time.
func TestWindowAtMaxAckPending(t *testing.T) {
	w := New()
	if !w.Sent(10, true) {
		t.Fatal("did not ask at max_ack_pending")
	}
	w.Requested("$JS.FC.S.C.aaaa")
	if w.Sent(10, true) {
		t.Fatal("asked again with a request owed")
	}
	if w.Owed() != "$JS.FC.S.C.aaaa" {
		t.Fatalf("owed %q", w.Owed())
	}
}
