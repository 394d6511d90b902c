package bridge

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkSoakWorkQueue publishes a backlog of messages to a workqueue stream, consumes and
// acknowledges all of them, and watches the stream's chunk tables in pg_stat_user_tables:
// dead tuples and total size, during consumption and after it. In the same database and the
// same run it does the same to the naive queue table (an INSERT per message; per ack a
// SELECT … FOR UPDATE SKIP LOCKED and a DELETE), the design retention avoids.
//
//	go test -bench Soak -run xxx -benchtime 1x ./bridge/
//
// JETGRES_SOAK_MSGS sets the message count (default 1,000,000); JETGRES_SOAK_HOLD_SNAPSHOT=1
// keeps a REPEATABLE READ transaction open through both consumptions, as a lagging replica
// or a forgotten session would.
func BenchmarkSoakWorkQueue(b *testing.B) {
	n := envCount(b, "JETGRES_SOAK_MSGS", 1_000_000)
	hold := os.Getenv("JETGRES_SOAK_HOLD_SNAPSHOT") == "1"
	for b.Loop() {
		soak(b, n, hold)
	}
}

// envCount is the positive number the environment variable name sets, or def when it is
// unset: the message count of a soak.
func envCount(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

const (
	soakPayload   = 128
	soakChunkRows = 16384
	soakBatch     = 500
	naiveWorkers  = 4
	sampleEvery   = 250 * time.Millisecond
	// statsSettle is how long after the last write the numbers are read: PostgreSQL 15 and
	// later flush a busy backend's table statistics within ten seconds of it going idle.
	statsSettle = 11 * time.Second
)

// tableStats is pg_stat_user_tables summed over a set of tables, at a point of a consumption.
type tableStats struct {
	pgtest.TableStats
	when            time.Duration
	consumedPercent int
}

func (s tableStats) short() string {
	return fmt.Sprintf("%3d%%: %2d tables, live %7d, dead %7d, %6.1f MiB",
		s.consumedPercent, s.Tables, s.Live, s.Dead, float64(s.Bytes)/(1<<20))
}

func readStats(ctx context.Context, probe *pgtest.ServerProbe, schema, like string) (tableStats, error) {
	st, err := probe.TableStats(ctx, schema, like)
	return tableStats{TableStats: st}, err
}

// tableSampler records table statistics every second while a consumption runs.
type tableSampler struct {
	probe        *pgtest.ServerProbe
	schema, like string
	done         *atomic.Int64
	total        int

	mu      sync.Mutex
	samples []tableStats
}

func (s *tableSampler) run(ctx context.Context, start time.Time) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := readStats(ctx, s.probe, s.schema, s.like)
		if err != nil {
			continue
		}
		st.when = time.Since(start)
		st.consumedPercent = int(s.done.Load() * 100 / int64(s.total))
		s.mu.Lock()
		s.samples = append(s.samples, st)
		s.mu.Unlock()
	}
}

func (s *tableSampler) peak() tableStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var p tableStats
	for _, st := range s.samples {
		p.Dead = max(p.Dead, st.Dead)
		p.Bytes = max(p.Bytes, st.Bytes)
		p.Tables = max(p.Tables, st.Tables)
		p.Live = max(p.Live, st.Live)
	}
	return p
}

// during picks a few samples spread over the consumption, for the log.
func (s *tableSampler) during() []tableStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []tableStats
	next := 0
	for _, st := range s.samples {
		if st.consumedPercent >= next && len(out) < 4 {
			out = append(out, st)
			next = st.consumedPercent/25*25 + 25
		}
	}
	return out
}

func soak(b *testing.B, n int, hold bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	url := pgtest.NewDB(b)
	db, err := pg.Open(ctx, pg.Config{URL: url})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	tb := setup(b, setupOpts{db: db})
	probe, err := pgtest.OpenProbe(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(probe.Close)
	if hold {
		release, err := probe.HoldSnapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer release()
	}

	// jetgres.
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SOAK", Subjects: []string{"soak.>"},
		Retention: jetstream.WorkQueuePolicy}); err != nil {
		b.Fatal(err)
	}
	s := tb.bridge.streams.Lookup("SOAK")
	s.SetChunkRows(soakChunkRows)
	start := time.Now()
	soakPublish(b, ctx, tb.js, n)
	pubTime := time.Since(start)
	jetLike := fmt.Sprintf(`msgs\_%d\_%%`, s.ID())
	before, err := readStats(ctx, probe, "jetgres", jetLike)
	if err != nil {
		b.Fatal(err)
	}
	var done atomic.Int64
	jetSamples := &tableSampler{probe: probe, schema: "jetgres", like: jetLike, done: &done, total: n}
	sctx, stopSampling := context.WithCancel(ctx)
	go jetSamples.run(sctx, time.Now())
	start = time.Now()
	soakConsume(b, ctx, tb.js, n, &done)
	jetConsume := time.Since(start)
	stopSampling()
	var jetAfter tableStats
	testwait.For(b, time.Minute, func() error {
		st, err := tb.js.Stream(ctx, "SOAK")
		if err != nil {
			return err
		}
		if msgs := st.CachedInfo().State.Msgs; msgs != 0 {
			return fmt.Errorf("%d messages left", msgs)
		}
		if jetAfter, err = readStats(ctx, probe, "jetgres", jetLike); err != nil {
			return err
		}
		if jetAfter.Tables > 1 || jetAfter.Live > 0 {
			return fmt.Errorf("chunk tables not dropped yet: %s", jetAfter.short())
		}
		return nil
	})
	time.Sleep(statsSettle)
	if jetAfter, err = readStats(ctx, probe, "jetgres", jetLike); err != nil {
		b.Fatal(err)
	}
	jetAfter.consumedPercent = 100
	tombs, err := readStats(ctx, probe, "jetgres", "deleted")
	if err != nil {
		b.Fatal(err)
	}

	// The naive queue.
	naive, err := pgtest.OpenNaive(ctx, url, naiveWorkers)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(naive.Close)
	if err := naive.Reset(ctx); err != nil {
		b.Fatal(err)
	}
	naiveLike := strings.ReplaceAll(pgtest.NaiveTable, "_", `\_`)
	start = time.Now()
	if err := naive.Fill(ctx, "soak.job", make([]byte, soakPayload), n); err != nil {
		b.Fatal(err)
	}
	naivePub := time.Since(start)
	var naiveDone atomic.Int64
	naiveSamples := &tableSampler{probe: probe, schema: pgtest.NaiveSchema, like: naiveLike, done: &naiveDone, total: n}
	sctx, stopSampling = context.WithCancel(ctx)
	go naiveSamples.run(sctx, time.Now())
	start = time.Now()
	if err := naive.Drain(ctx, naiveWorkers, soakBatch, &naiveDone); err != nil {
		b.Fatal(err)
	}
	naiveTime := time.Since(start)
	stopSampling()
	if got := naiveDone.Load(); got != int64(n) {
		b.Fatalf("naive queue: %d of %d messages consumed", got, n)
	}
	time.Sleep(statsSettle)
	naiveAfter, err := readStats(ctx, probe, pgtest.NaiveSchema, naiveLike)
	if err != nil {
		b.Fatal(err)
	}

	naiveAfter.consumedPercent = 100

	// A benchmark keeps ten lines of log: one table, the two queues side by side.
	b.Logf("%d messages of %d bytes; jetgres chunks of %d rows; snapshot held: %v", n, soakPayload, soakChunkRows, hold)
	b.Logf("%-12s %-58s | %s", "", "jetgres workqueue stream (chunk tables)", "naive DELETE-on-ack table")
	b.Logf("%-12s %-58s | %v", "fill", pubTime.Round(time.Millisecond), naivePub.Round(time.Millisecond))
	b.Logf("%-12s %-58s | %v", "consume+ack", jetConsume.Round(time.Millisecond), naiveTime.Round(time.Millisecond))
	jd, nd := jetSamples.during(), naiveSamples.during()
	for i := range max(len(jd), len(nd)) {
		var l, r string
		if i < len(jd) {
			l = jd[i].short()
		}
		if i < len(nd) {
			r = nd[i].short()
		}
		b.Logf("%-12s %-58s | %s", "during", l, r)
	}
	b.Logf("%-12s %-58s | %s", "after", jetAfter.short()+fmt.Sprintf(" tombstones %d", tombs.Live), naiveAfter.short())

	jp, np := jetSamples.peak(), naiveSamples.peak()
	b.ReportMetric(float64(jp.Dead), "jetgres-peak-dead-tup")
	b.ReportMetric(float64(jetAfter.Dead), "jetgres-after-dead-tup")
	b.ReportMetric(float64(max(jp.Bytes, before.Bytes))/(1<<20), "jetgres-peak-MiB")
	b.ReportMetric(float64(jetAfter.Bytes)/(1<<20), "jetgres-after-MiB")
	b.ReportMetric(float64(np.Dead), "naive-peak-dead-tup")
	b.ReportMetric(float64(naiveAfter.Dead), "naive-after-dead-tup")
	b.ReportMetric(float64(np.Bytes)/(1<<20), "naive-peak-MiB")
	b.ReportMetric(float64(naiveAfter.Bytes)/(1<<20), "naive-after-MiB")
}

func soakPublish(b *testing.B, ctx context.Context, js jetstream.JetStream, n int) {
	payload := make([]byte, soakPayload)
	for i := range n {
		if _, err := js.PublishAsync("soak.job", payload, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatalf("publish %d: %v", i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
}

func soakConsume(b *testing.B, ctx context.Context, js jetstream.JetStream, n int, done *atomic.Int64) {
	c, err := js.CreateOrUpdateConsumer(ctx, "SOAK", jetstream.ConsumerConfig{Durable: "worker",
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4 * soakBatch})
	if err != nil {
		b.Fatal(err)
	}
	for done.Load() < int64(n) {
		batch, err := c.Fetch(soakBatch, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				b.Fatal(err)
			}
			done.Add(1)
		}
		if err := batch.Error(); err != nil {
			b.Fatal(err)
		}
	}
}
