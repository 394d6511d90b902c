package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// legacyJS is nats.go's JetStreamContext on the bundle's connection: js.Subscribe and its
// kin make push consumers.
func legacyJS(t *testing.T, nc *nats.Conn) nats.JetStreamContext {
	t.Helper()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// nextMsgs reads n messages from a synchronous subscription, failing after within.
func nextMsgs(t *testing.T, sub *nats.Subscription, n int, within time.Duration) []*nats.Msg {
	t.Helper()
	out := make([]*nats.Msg, 0, n)
	deadline := time.Now().Add(within)
	for len(out) < n {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(out), n, err)
		}
		out = append(out, m)
	}
	return out
}

func TestPushSubscribeSync(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "PS", "ps.>")
	publishN(t, ctx, tb.js, "ps.a", 5)
	js := legacyJS(t, tb.nc)
	sub, err := js.SubscribeSync("ps.>", nats.Durable("D"), nats.AckExplicit())
	if err != nil {
		t.Fatal(err)
	}
	msgs := nextMsgs(t, sub, 5, 5*time.Second)
	for i, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != fmt.Sprint(i+1) || m.Subject != "ps.a" || md.NumPending != uint64(4-i) || md.Sequence.Stream != uint64(i+1) {
			t.Fatalf("message %d: %q %q %+v", i, m.Subject, m.Data, md)
		}
		if err := m.AckSync(); err != nil {
			t.Fatal(err)
		}
	}
	publishN(t, ctx, tb.js, "ps.b", 3)
	nextMsgs(t, sub, 3, 5*time.Second)
}
