package e2e

// Throughput of one replica against three, and the time a takeover takes.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkReplicas measures async publish and fetch throughput of one replica against three
// on the same PostgreSQL, in one run, and the time from the SIGKILL of the replica serving
// a consumer to its first delivery from another (pulls of 100 ms, so that a pull lost with
// the dead replica costs the client little):
//
//	go test -run '^$' -bench BenchmarkReplicas -benchtime 20000x ./e2e/
//
// Publishes and fetches are spread over the replicas' clients evenly. On one small machine
// the replicas share its cores with PostgreSQL: three must not be slower than one.
func BenchmarkReplicas(b *testing.B) {
	pgs := startPGServer(b)
	for _, n := range []int{1, 3} {
		stream := fmt.Sprintf("BENCH%d", n)
		c := newCluster(b, pgs.dsn(), n, "--lease", "2s")
		ctx := context.Background()
		jss := make([]jetstream.JetStream, n)
		for i := range n {
			_, jss[i] = c.rep(i).connect(b)
		}
		if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{strings.ToLower(stream) + ".>"}}); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("replicas=%d/publish", n), func(b *testing.B) {
			b.SetBytes(128)
			var wg sync.WaitGroup
			for i := range n {
				share := b.N / n
				if i == 0 {
					share += b.N % n
				}
				wg.Go(func() {
					publishAll(b, ctx, jss[i], fmt.Sprintf("%s.r%d", strings.ToLower(stream), i), share, func(int) []byte { return make([]byte, 128) })
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("replicas=%d/fetch", n), func(b *testing.B) {
			b.StopTimer()
			name := fmt.Sprintf("f%d", b.N)
			if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				b.Fatal(err)
			}
			conses := make([]jetstream.Consumer, n)
			for i := range n {
				var err error
				if conses[i], err = jss[i].Consumer(ctx, stream, name); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			// The last message ends every fetcher's pull at once: the others would otherwise
			// wait for theirs to expire.
			fctx, done := context.WithCancel(ctx)
			defer done()
			var got atomic.Int64
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					for fctx.Err() == nil {
						pull, cancel := context.WithTimeout(fctx, time.Second)
						batch, err := conses[i].Fetch(500, jetstream.FetchContext(pull))
						if err != nil {
							cancel()
							if fctx.Err() == nil {
								b.Error(err)
							}
							return
						}
						for m := range batch.Messages() {
							_ = m.Ack()
							if got.Add(1) == int64(b.N) {
								done()
							}
						}
						cancel()
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
		if n < 3 {
			// Nothing of it may run beside the next cluster.
			c.stop()
			continue
		}
		b.Run("replicas=3/takeover", func(b *testing.B) {
			b.StopTimer()
			if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "takeover", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				b.Fatal(err)
			}
			// Each round kills a replica and starts it again: five are enough, whatever
			// -benchtime asks of the publish and fetch runs.
			rounds := min(b.N, 5)
			var total time.Duration
			for range rounds {
				nc, err := nats.Connect(c.urls())
				if err != nil {
					b.Fatal(err)
				}
				js, _ := jetstream.New(nc)
				cons, err := js.Consumer(ctx, stream, "takeover")
				if err != nil {
					b.Fatal(err)
				}
				var victim int
				if _, err := fmt.Sscanf(cons.CachedInfo().Cluster.Leader, "r%d", &victim); err != nil {
					b.Fatalf("consumer leader %q: %v", cons.CachedInfo().Cluster.Leader, err)
				}
				victim--
				killed := time.Now()
				c.rep(victim).kill(b)
				for {
					if time.Since(killed) > 30*time.Second {
						b.Fatal("no delivery within 30 s of the SIGKILL")
					}
					batch, err := cons.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
					if err == nil {
						if _, ok := <-batch.Messages(); ok {
							break
						}
					}
				}
				total += time.Since(killed)
				nc.Close()
				c.restart(victim)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(rounds), "ms/takeover")
		})
	}
}
