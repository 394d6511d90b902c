package bridge

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jstwin"
)

// BenchmarkRepublish publishes b.N messages asynchronously (2,000 at a time), over 16 subjects, to a stream
// that republishes them, and waits until a subscriber of the destination has them all: the
// rate of stored and republished messages, on jetgres and on JetStream (sync_always, the
// durability of jetgres's PubAck).
func BenchmarkRepublish(b *testing.B) {
	for _, side := range []string{"jetgres", "jetstream"} {
		b.Run(side, func(b *testing.B) {
			var js jetstream.JetStream
			if side == "jetgres" {
				js = setup(b).js
			} else {
				js = startJetStreamWith(b, jstwin.Config{SyncAlways: true})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RB", Subjects: []string{"rb.>"},
				RePublish: &jetstream.RePublish{Source: "rb.>", Destination: "rbo.>"}}); err != nil {
				b.Fatal(err)
			}
			sub, err := js.Conn().SubscribeSync("rbo.>")
			if err != nil {
				b.Fatal(err)
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil {
				b.Fatal(err)
			}
			if err := js.Conn().Flush(); err != nil {
				b.Fatal(err)
			}
			subjects := make([]string, 16)
			for i := range subjects {
				subjects[i] = "rb." + strconv.Itoa(i)
			}
			data := make([]byte, 128)
			b.ResetTimer()
			for i := range b.N {
				if _, err := js.PublishAsync(subjects[i%len(subjects)], data); err != nil {
					b.Fatal(err)
				}
				// nats.go stalls past 4,000 acks outstanding: publish in windows below it.
				if i%2000 == 1999 {
					select {
					case <-js.PublishAsyncComplete():
					case <-ctx.Done():
						b.Fatal("publish acks never all came")
					}
				}
			}
			for i := range b.N {
				if _, err := sub.NextMsg(30 * time.Second); err != nil {
					b.Fatalf("republished %d of %d: %v", i, b.N, err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				b.Fatal("publish acks never all came")
			}
		})
	}
}
