package bridge

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkAtomicBatch publishes atomic batches of 100 and 1,000 messages of 128 bytes, one
// batch at a time, to jetgres and to a real JetStream (file storage): the messages without
// waiting, the commit as a request. It reports messages per second; each batch commits as
// one transaction on jetgres.
func BenchmarkAtomicBatch(b *testing.B) {
	for _, size := range []int{100, 1000} {
		for side, name := range sideName {
			b.Run(fmt.Sprintf("%s/%d", name, size), func(b *testing.B) {
				var js jetstream.JetStream
				if side == ours {
					js = setup(b).js
				} else {
					js = startJetStream(b)
				}
				ctx := context.Background()
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AB", Subjects: []string{"ab.>"}, AllowAtomicPublish: true}); err != nil {
					b.Fatal(err)
				}
				nc := js.Conn()
				data := make([]byte, 128)
				b.ResetTimer()
				for i := range b.N {
					id := fmt.Sprintf("b%d", i)
					for seq := 1; seq <= size; seq++ {
						commit := ""
						if seq == size {
							commit = "1"
						}
						m := batchMsg("ab.x", id, seq, commit)
						m.Data = data
						if seq < size {
							if err := nc.PublishMsg(m); err != nil {
								b.Fatal(err)
							}
							continue
						}
						reply, err := nc.RequestMsg(m, 30*time.Second)
						if err != nil {
							b.Fatal(err)
						}
						if bytes.Contains(reply.Data, []byte(`"error"`)) {
							b.Fatalf("batch refused: %s", reply.Data)
						}
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
			})
		}
	}
}
