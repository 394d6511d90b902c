package bridge

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

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
	b.Run("jetgres", benchKVGets)
	b.Run("floor", benchGetFloor)
}

// benchGetFloor is the floor under BenchmarkKVGetConcurrent: the same eight clients
// requesting through the same embedded NATS server from an ordinary client that answers
// each from a map, with a message as large as a get's. A get through jetgres crosses the
// server twice, as this does; a JetStream direct get crosses it once.
func benchGetFloor(b *testing.B) {
	tb := setup(b)
	answer := make([]byte, 128+200)
	values := make(map[string][]byte)
	for i := range 1000 {
		values[strconv.Itoa(i)] = answer
	}
	responder, err := nats.Connect(tb.nats.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(responder.Close)
	if _, err := responder.Subscribe("floor.get.*", func(m *nats.Msg) {
		_ = m.Respond(values[m.Subject[len("floor.get."):]])
	}); err != nil {
		b.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		b.Fatal(err)
	}
	conns := make([]*nats.Conn, getBenchClients)
	for i := range conns {
		if conns[i], err = nats.Connect(tb.nats.ClientURL()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conns[i].Close)
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for c, nc := range conns {
		n := b.N / getBenchClients
		if c < b.N%getBenchClients {
			n++
		}
		wg.Go(func() {
			for i := range n {
				if _, err := nc.Request("floor.get."+strconv.Itoa((c*n+i)%1000), nil, 10*time.Second); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func benchKVGets(b *testing.B) {
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
	memory, database := getCount(b, tb.reg, "served", "memory"), getCount(b, tb.reg, "served", "database")
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
	b.ReportMetric(getCount(b, tb.reg, "served", "memory")-memory, "memory")
	b.ReportMetric(getCount(b, tb.reg, "served", "database")-database, "database")
}
