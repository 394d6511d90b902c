package bridge

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// durableSetup is setup on a cluster of the benchmark's own with fsync and
// synchronous_commit on, as an application's database runs: pgtest's shared cluster has
// both off, which hides the WAL flush that every commit pays and that commits which
// serialise (NOTIFY's) cannot share. It returns the database's URL beside the bundle.
func durableSetup(b *testing.B) (*testBundle, string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "jetgres-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The server may run as another user, which must be able to enter the directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		b.Fatal(err)
	}
	c, err := localpg.Start(ctx, localpg.Config{DataDir: filepath.Join(dir, "pg"), Settings: map[string]string{
		"fsync": "on", "synchronous_commit": "on", "max_connections": "200", "shared_buffers": "128MB"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = c.Stop(ctx)
	})
	db, err := pg.Open(ctx, pg.Config{URL: c.DSN()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	return setup(b, setupOpts{db: db}), c.DSN()
}

// BenchmarkSQLPublish sets publishing from SQL beside the same load written by a plain
// INSERT into an application table, in one run: 100 sessions with one message per
// transaction, and one session with 10,000 messages per transaction (one statement over
// generate_series for both). One op is one message; msgs/s is what the sessions committed.
// PostgreSQL runs with fsync and synchronous_commit on (durableSetup). The floor is the
// bare INSERT a call makes, into a table shaped as staging is (the transaction's id, a call
// number from a sequence, the (xid, call) index): what no function body can go below.
// floorcall is that INSERT inside a PL/pgSQL function that does nothing else: a call is a
// statement of its own, which a row of one INSERT over generate_series is not, so this is
// what no per-call body can go below.
//
//	go test -run '^$' -bench 'SQLPublish' -benchtime 3s ./bridge/
func BenchmarkSQLPublish(b *testing.B) {
	tb, url := durableSetup(b)
	ctx := context.Background()
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		b.Fatal(err)
	}
	raw := rawsql.Open(b, pgtest.WithParam(b, url, "pool_max_conns", "110"))
	if err := raw.Exec(ctx, `CREATE TABLE app_events (id bigserial PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if err := raw.Exec(ctx, `CREATE SEQUENCE floor_call CACHE 64;
		CREATE TABLE floor_staged (LIKE jetgres.staged_0 INCLUDING ALL);
		CREATE FUNCTION floor_call(subject text, data bytea) RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO floor_staged (call, stream_id, subject, data) VALUES (nextval('floor_call'), 1, subject, data);
		END $$`); err != nil {
		b.Fatal(err)
	}
	const insert = `INSERT INTO app_events (subject, data) VALUES ($1, $2::text::bytea)`
	const publish = `SELECT jetgres.publish($1, $2::text)`
	const insertMany = `INSERT INTO app_events (subject, data) SELECT 's.x', g::text::bytea FROM generate_series(1, $1) g`
	const publishMany = `SELECT jetgres.publish('s.x', g::text) FROM generate_series(1, $1) g`
	const floor = `INSERT INTO floor_staged (call, stream_id, subject, data) VALUES (nextval('floor_call'), 1, $1, $2::text::bytea)`
	const floorMany = `INSERT INTO floor_staged (call, stream_id, subject, data) SELECT nextval('floor_call'), 1, 's.x', g::text::bytea FROM generate_series(1, $1) g`
	const floorCall = `SELECT floor_call($1, $2::text::bytea)`
	const floorCallMany = `SELECT floor_call('s.x', g::text::bytea) FROM generate_series(1, $1) g`
	for _, c := range []struct {
		name, sql string
		sessions  int
	}{
		{"insert/100x1", insert, 100},
		{"publish/100x1", publish, 100},
		{"floor/100x1", floor, 100},
		{"floorcall/100x1", floorCall, 100},
		{"insert/1x10000", insertMany, 1},
		{"publish/1x10000", publishMany, 1},
		{"floor/1x10000", floorMany, 1},
		{"floorcall/1x10000", floorCallMany, 1},
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
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Querier) error {
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
