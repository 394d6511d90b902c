package bridge

import (
	"context"
	"runtime"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkAsyncPublish sends 50,000 asynchronous publishes per iteration through the whole
// path (client, NATS server, link, bridge, PostgreSQL) and reports the memory allocated per
// message by everything in the process, client included. Throughput belongs to the project's
// bench command, which compares it with JetStream in the same run; this one watches the
// allocations that the garbage collector pays for on every publish.
func BenchmarkAsyncPublish(b *testing.B) {
	const msgs = 50000
	tb := setup(b)
	ctx := context.Background()
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ASYNC", Subjects: []string{"async.>"}}); err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(tb.nc, jetstream.WithPublishAsyncMaxPending(1000))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		for range msgs {
			if _, err := js.PublishAsync("async.x", data); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
		}
	}
	runtime.ReadMemStats(&after)
	n := float64(b.N * msgs)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/msg")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/msg")
}
