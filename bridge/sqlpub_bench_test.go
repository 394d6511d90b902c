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

// BenchmarkSQLPublish sets publishing from SQL beside the same load written by a plain
// INSERT into an application table, in one run: 100 sessions with one message per
// transaction, and one session with 10,000 messages per transaction (one statement over
// generate_series for both). One op is one message; msgs/s is what the sessions committed.
//
//	go test -run '^$' -bench 'SQLPublish' -benchtime 3s ./bridge/
func BenchmarkSQLPublish(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		b.Fatal(err)
	}
	raw := rawsql.Open(b, pgtest.WithParam(b, tb.dbURL, "pool_max_conns", "110"))
	if err := raw.Exec(ctx, `CREATE TABLE app_events (id bigserial PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	const insert = `INSERT INTO app_events (subject, data) VALUES ($1, $2::text::bytea)`
	const publish = `SELECT jetgres.publish($1, $2::text)`
	const insertMany = `INSERT INTO app_events (subject, data) SELECT 's.x', g::text::bytea FROM generate_series(1, $1) g`
	const publishMany = `SELECT jetgres.publish('s.x', g::text) FROM generate_series(1, $1) g`
	for _, c := range []struct {
		name, sql string
		sessions  int
	}{
		{"insert/100x1", insert, 100},
		{"publish/100x1", publish, 100},
		{"insert/1x10000", insertMany, 1},
		{"publish/1x10000", publishMany, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range c.sessions {
				wg.Go(func() {
					for {
						if c.sessions == 1 {
							from := next.Add(10_000) - 10_000
							if from >= int64(b.N) {
								return
							}
							n := min(int64(b.N)-from, 10_000)
							if err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Querier) error { return q.Exec(ctx, c.sql, n) }); err != nil {
								b.Error(err)
								return
							}
							continue
						}
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Querier) error {
							return q.Exec(ctx, c.sql, "s.x", strconv.FormatInt(i, 10))
						}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkSQLPublishLatency measures end-to-end latency from an application's COMMIT (the
// moment it is sent) to a waiting pull consumer receiving the message, one message per
// transaction at 1,000 messages a second. One op is one message.
//
//	go test -run '^$' -bench 'SQLPublishLatency' -benchtime 5s ./bridge/
func BenchmarkSQLPublishLatency(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		b.Fatal(err)
	}
	raw := rawsql.Open(b, pgtest.WithParam(b, tb.dbURL, "pool_max_conns", "16"))
	sent := make([]atomic.Int64, b.N)
	lat := make([]time.Duration, 0, b.N)
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
			err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Querier) error {
				if err := q.Exec(ctx, `SELECT jetgres.publish('s.x', $1::text)`, strconv.Itoa(i)); err != nil {
					return err
				}
				sent[i].Store(time.Now().UnixNano())
				return nil
			})
			if err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	select {
	case <-all:
	case <-time.After(time.Minute):
		b.Fatalf("only %d of %d messages arrived", len(lat), b.N)
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}
