package bridge

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// getBenchClients is the client count of `nats bench kv get --clients 8`, issue 16's goal.
const getBenchClients = 8

// BenchmarkKVGetConcurrent is `nats bench kv get --clients 8` in process: eight clients, each
// on its own connection, reading keys that a put just wrote, one get at a time. Run it with
// -cpuprofile, -mutexprofile and -blockprofile to see what serialises concurrent gets; the
// memory and database counts say where the answers came from.
func BenchmarkKVGetConcurrent(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	const keys = 1000
	kv, err := tb.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "GETKV"})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	for i := range keys {
		if _, err := kv.Put(ctx, strconv.Itoa(i), data); err != nil {
			b.Fatal(err)
		}
	}
	buckets := make([]jetstream.KeyValue, getBenchClients)
	for i := range buckets {
		nc, err := nats.Connect(tb.nats.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		if buckets[i], err = js.KeyValue(ctx, "GETKV"); err != nil {
			b.Fatal(err)
		}
	}
	memory, database := gets(b, tb.bridge, "served", "memory"), gets(b, tb.bridge, "served", "database")
	b.ResetTimer()
	var wg sync.WaitGroup
	for c, kv := range buckets {
		n := b.N / getBenchClients
		if c < b.N%getBenchClients {
			n++
		}
		wg.Go(func() {
			for i := range n {
				if _, err := kv.Get(ctx, strconv.Itoa((c*n+i)%keys)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(gets(b, tb.bridge, "served", "memory")-memory, "memory")
	b.ReportMetric(gets(b, tb.bridge, "served", "database")-database, "database")
}
