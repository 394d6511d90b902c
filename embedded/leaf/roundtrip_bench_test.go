package leaf_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/embedded/leaf"
)

// BenchmarkRequestRoundTrip compares a request answered through the link with one answered
// by a second client of the same server: the link's share of a publish's latency. The
// "after-idle" runs pause half a millisecond between requests, about what a lone publish
// waits for its commit, so every hop starts from parked threads, as it does for a lone
// publisher; back to back, the threads are still awake.
func BenchmarkRequestRoundTrip(b *testing.B) {
	for _, pause := range []struct {
		name string
		d    time.Duration
	}{{"back-to-back", 0}, {"after-idle", 500 * time.Microsecond}} {
		b.Run("link/"+pause.name, func(b *testing.B) {
			srv := startServer(b, nil)
			link := dial(b, srv.Leaf(), nil)
			nc := connect(b, srv)
			if _, err := link.Subscribe("svc.echo", "", func(m *leaf.Msg) {
				if err := link.Publish(m.Reply, "", nil, m.Data); err != nil {
					b.Errorf("reply: %v", err)
				}
			}); err != nil {
				b.Fatal(err)
			}
			flushBoth(b, nc, link)
			requestLoop(b, nc, pause.d)
		})
		b.Run("client/"+pause.name, func(b *testing.B) {
			srv := startServer(b, nil)
			nc, responder := connect(b, srv), connect(b, srv)
			if _, err := responder.Subscribe("svc.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
				b.Fatal(err)
			}
			if err := responder.Flush(); err != nil {
				b.Fatal(err)
			}
			requestLoop(b, nc, pause.d)
		})
	}
}

// requestLoop reports the mean round trip alone, without the pauses.
func requestLoop(b *testing.B, nc *nats.Conn, pause time.Duration) {
	data := make([]byte, 128)
	var total time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := nc.Request("svc.echo", data, waitTimeout); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N)/1e3, "µs/request")
}
