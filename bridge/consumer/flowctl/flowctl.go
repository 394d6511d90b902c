// Package flowctl is a push consumer's flow control as nats-server keeps it: the bytes
// sent since the last answered request, the window they may reach, and the request owed.
// The window starts at a sixteenth of nats-server's JsFlowControlMaxPending and doubles
// with every answer, as nats-server ramps a slow start.
//
// Besides the byte window, a consumer with the flow_control ack policy asks for an answer
// once max_ack_pending is reached, and the answer carries its acknowledgement (see
// jswire.FlowControlAck); the consumer passes that condition to Sent.
//
// A Window is not safe for concurrent use; the consumer that owns it serialises access.
package flowctl

import "time"

// MaxWindow is nats-server's JsFlowControlMaxPending: the most bytes a flow-controlled push
// consumer sends past the last answered request.
const MaxWindow = 32 << 20

// Window is the flow-control state of one push consumer.
type Window struct {
	max, bytes int
	// owed is the reply subject of the request waiting for its answer, "" if none, and
	// owedSize the bytes its answer releases.
	owed     string
	owedSize int
	stalled  time.Time // when the window closed, zero while open
}

// New returns the window of a consumer that has sent nothing yet.
func New() *Window { return &Window{max: MaxWindow / 16} }

// Closed reports whether delivery waits for the answer to the request owed.
func (w *Window) Closed() bool { return w.bytes > w.max }

// Stall notes that delivery waits at now, and reports whether it just started waiting.
func (w *Window) Stall(now time.Time) bool {
	if !w.stalled.IsZero() {
		return false
	}
	w.stalled = now
	return true
}

// StalledSince is when delivery began to wait for the answer owed, zero while it does not.
func (w *Window) StalledSince() time.Time { return w.stalled }

// Sent accounts a delivery of size bytes and reports whether a request is due now: past
// half the window, or when atMaxAckPending says the flow_control ack policy needs an
// answer to free its pending deliveries.
func (w *Window) Sent(size int, atMaxAckPending bool) bool {
	w.bytes += size
	if w.owed == "" {
		return w.bytes > w.max/2 || atMaxAckPending
	}
	if w.bytes-w.owedSize >= w.max {
		// nats-server widens what the request owed covers once the window passed it.
		w.owedSize += size
	}
	return false
}

// Requested records the request just sent, whose answer comes to reply: it covers
// everything sent so far.
func (w *Window) Requested(reply string) { w.owed, w.owedSize = reply, w.bytes }

// Owed is the reply subject of the request waiting for its answer, "" if none.
func (w *Window) Owed() string { return w.owed }

// Answered takes an answer to the request replied to subject. Only the newest request
// counts, as in nats-server; Answered reports whether this was its answer.
func (w *Window) Answered(subject string) bool {
	if w.owed == "" || subject != w.owed {
		return false
	}
	w.max = min(w.max*2, MaxWindow)
	w.bytes = max(w.bytes-w.owedSize, 0)
	w.owed, w.owedSize = "", 0
	w.stalled = time.Time{}
	return true
}
