package bridge

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// durableSetup is setup on a cluster of the benchmark's own with fsync and
// synchronous_commit on (pgtest.Durable), as an application's database runs. It returns
// the database's URL beside the bundle.
func durableSetup(b *testing.B) (*testBundle, string) {
	b.Helper()
	url := pgtest.Durable(b)
	return setup(b, setupOpts{db: pgtest.OpenAt(b, url)}), url
}

// BenchmarkSQLPublishLatency measures end-to-end latency from an application's COMMIT (the
// moment it is sent) to a waiting pull consumer receiving the message, one message per
// transaction at 1,000 messages a second. One op is one message. Beside it, the floor:
// the application's COMMIT followed by a second transaction that inserts a row and commits,
// as a move must before a consumer may see the message: two WAL flushes in a row.
//
//	go test -run '^$' -bench 'SQLPublishLatency' -benchtime 5s ./bridge/
func BenchmarkSQLPublishLatency(b *testing.B) {
	tb, url := durableSetup(b)
	ctx := context.Background()
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		b.Fatal(err)
	}
	raw := rawsql.Open(b, pgtest.WithParam(b, url, "pool_max_conns", "16"))
	sent := make([]atomic.Int64, b.N)
	lat := make([]time.Duration, 0, b.N)
	// commits is how long each COMMIT took from the moment it was sent: the application's
	// own WAL flush, a floor under the latency that no mover can go below.
	commits := make([]time.Duration, b.N)
	var mu sync.Mutex
	all := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		at := time.Now()
		i, _ := strconv.Atoi(string(m.Data()))
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, at.Sub(time.Unix(0, sent[i].Load())))
		if len(lat) == b.N {
			close(all)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Stop()
	b.ResetTimer()
	const every = time.Millisecond
	start := time.Now()
	var wg sync.WaitGroup
	for i := range b.N {
		if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
			time.Sleep(d)
		}
		wg.Go(func() {
			err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
				if err := q.Exec(ctx, `SELECT jetgres.publish('s.x', $1::text)`, strconv.Itoa(i)); err != nil {
					return err
				}
				sent[i].Store(time.Now().UnixNano())
				return nil
			})
			if err != nil {
				b.Error(err)
			}
			commits[i] = time.Since(time.Unix(0, sent[i].Load()))
		})
	}
	wg.Wait()
	select {
	case <-all:
	case <-time.After(time.Minute):
		b.Fatalf("only %d of %d messages arrived", len(lat), b.N)
	}
	b.StopTimer()
	if err := raw.Exec(ctx, `CREATE TABLE floor_latency (n int)`); err != nil {
		b.Fatal(err)
	}
	floors := make([]time.Duration, 0, 500)
	for n := range cap(floors) {
		var at time.Time
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			if err := q.Exec(ctx, `INSERT INTO floor_latency VALUES ($1)`, n); err != nil {
				return err
			}
			at = time.Now()
			return nil
		})
		if err == nil {
			err = raw.Exec(ctx, `INSERT INTO floor_latency VALUES ($1)`, n)
		}
		if err != nil {
			b.Fatal(err)
		}
		floors = append(floors, time.Since(at))
	}
	slices.Sort(floors)
	slices.Sort(lat)
	slices.Sort(commits)
	q := func(d []time.Duration, p float64) float64 { return float64(d[int(p*float64(len(d)-1))]) / 1e6 }
	b.ReportMetric(q(lat, 0.5), "p50-ms")
	b.ReportMetric(q(lat, 0.99), "p99-ms")
	b.ReportMetric(q(commits, 0.5), "commit-p50-ms")
	b.ReportMetric(q(floors, 0.5), "floor-p50-ms")
	b.ReportMetric(0, "ns/op")
}
