package bridge

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// limitedStream is a stream whose limits keep few messages, published to at full speed.
type limitedStream struct {
	name    string
	cfg     jetstream.StreamConfig
	subject func(i int) string
	live    int // the messages its limits keep once it has taken enough
}

var (
	maxMsgsStream = limitedStream{name: "max_msgs_1000",
		cfg:     jetstream.StreamConfig{Name: "LIM", Subjects: []string{"lim.>"}, MaxMsgs: 1000},
		subject: func(int) string { return "lim.x" }, live: 1000}
	// The keys of a key-value bucket with history 1, each overwritten in turn.
	kvStream = limitedStream{name: "kv_100_keys",
		cfg:     jetstream.StreamConfig{Name: "KVL", Subjects: []string{"kvl.>"}, MaxMsgsPerSubject: 1},
		subject: func(i int) string { return "kvl." + strconv.Itoa(i%100) }, live: 100}
)

// streamRows counts the rows jetgres.msgs holds for a stream, over all its chunk tables, and
// the chunk it appends to (how many it opened, less one).
func streamRows(ctx context.Context, db *rawsql.Pool, id int64) (rows, chunk int64, err error) {
	err = db.QueryRow(ctx, `SELECT (SELECT count(*) FROM jetgres.msgs WHERE stream_id = $1),
		(SELECT chunk FROM jetgres.stream_state WHERE stream_id = $1)`, id).Scan(&rows, &chunk)
	return rows, chunk, err
}

// publishLimited publishes n messages of 128 bytes asynchronously to ls, at most 1000
// unacknowledged, and returns how long until every one was acknowledged.
func publishLimited(t testing.TB, ctx context.Context, tb *testBundle, ls limitedStream, n int) time.Duration {
	t.Helper()
	var mu sync.Mutex
	var failed error
	js, err := jetstream.New(tb.nc, jetstream.WithPublishAsyncMaxPending(1000),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			mu.Lock()
			defer mu.Unlock()
			failed = err
		}))
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 128)
	start := time.Now()
	for i := range n {
		if _, err := js.PublishAsync(ls.subject(i), data, jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acknowledged in time")
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if failed != nil {
		t.Fatalf("a publish failed: %v", failed)
	}
	return took
}

// A stream whose limits keep few messages holds, once its chunks past the first sequence
// are dropped, at most what its limits keep and one chunk of the size its configuration
// chooses; a key-value bucket with history 1 whose keys are overwritten likewise. Published
// to in bursts slower than its appends' chunk size, its chunks are closed by the maintainer
// at that size (on the injected clock). Chunks of pg.ChunkRowsDefault kept up to that many
// rows of either.
func TestLimitedStreamHoldsAFewChunks(t *testing.T) {
	for _, ls := range []limitedStream{maxMsgsStream, kvStream} {
		t.Run(ls.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			clk := clocktest.New()
			tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clk }})
			if _, err := tb.js.CreateStream(ctx, ls.cfg); err != nil {
				t.Fatal(err)
			}
			s := tb.bridge.streams.Lookup(ls.cfg.Name)
			if s.ChunkRows() != pg.ChunkRowsAppendMin || s.ChunkCloseRows() != pg.ChunkRowsMin {
				t.Fatalf("chunks of %d rows closed at %d, want %d and %d", s.ChunkRows(), s.ChunkCloseRows(), pg.ChunkRowsAppendMin, pg.ChunkRowsMin)
			}
			db := rawsql.Open(t, tb.dbURL)
			// Within 12 minutes of the clock in all (see TestMaxAgeClosesChunksByAge).
			for burst := range int64(8) {
				publishLimited(t, ctx, tb, ls, pg.ChunkRowsMin)
				for range 2 * int(pg.ChunkCloseAge/time.Second) {
					clk.Advance(time.Second)
				}
				waitTicking(t, clk, 2*pg.ChunkCloseAge, func() error {
					if _, chunk, err := streamRows(ctx, db, s.ID()); err != nil || chunk != burst+1 {
						return fmt.Errorf("after burst %d: appending to chunk %d (%v), want %d", burst+1, chunk, err, burst+1)
					}
					return nil
				})
			}
			bound := int64(ls.live) + pg.ChunkRowsMin
			waitTicking(t, clk, time.Minute, func() error {
				rows, _, err := streamRows(ctx, db, s.ID())
				if err != nil {
					return err
				}
				if rows > bound {
					return fmt.Errorf("%d rows held for %d live messages, want at most %d", rows, ls.live, bound)
				}
				return nil
			})
		})
	}
}

// Every process serving a stream chooses its chunk size from the stored configuration: a
// replica, or the process after a restart, closes the chunks it appends to at the same
// sequences, and a stream update changes the size of the chunks opened after it.
func TestChunkSizeFollowsStoredConfig(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	a := setup(t)
	cfg := jetstream.StreamConfig{Name: "CH", Subjects: []string{"ch.>"}, MaxMsgs: 66_000}
	if _, err := a.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	ch := limitedStream{cfg: cfg, subject: func(int) string { return "ch.x" }}
	b := setup(t, setupOpts{db: a.db})
	serves := func(name string, tb *testBundle, want int64) {
		t.Helper()
		testwait.For(t, 30*time.Second, func() error {
			s := tb.bridge.streams.Lookup("CH")
			if s == nil {
				return fmt.Errorf("%s process does not serve the stream yet", name)
			}
			if got := s.ChunkRows(); got != want {
				return fmt.Errorf("%s process: chunks of %d rows, want %d", name, got, want)
			}
			return nil
		})
	}
	serves("first", a, 66_000/4+1)
	serves("second", b, 66_000/4+1)
	publishLimited(t, ctx, a, ch, 12_000)
	publishLimited(t, ctx, b, ch, 12_000)
	cfg.MaxMsgs = 65_540
	if _, err := a.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	serves("first, after the update,", a, 65_540/4+1)
	serves("second, after the update,", b, 65_540/4+1)
	a.stop(t)
	c := setup(t, setupOpts{db: a.db})
	serves("restarted", c, 65_540/4+1)
	publishLimited(t, ctx, c, ch, 10_000)
	// Chunks of 16,501 rows from sequence 1, whichever process stored the messages; then,
	// from the update on, of 16,386 rows from the start of the chunk open at the update.
	db := rawsql.Open(t, a.dbURL)
	id := c.bridge.streams.Lookup("CH").ID()
	got := db.Strings(t, `SELECT first_seq::text FROM jetgres.chunks WHERE stream_id = $1 ORDER BY chunk`, id)
	if want := []string{"1", "16502", "32888"}; !slices.Equal(got, want) {
		t.Fatalf("chunks begin at %v, want %v", got, want)
	}
}

// BenchmarkChunkSizes publishes asynchronously, at most 1000 unacknowledged, into a stream
// limited to max_msgs 1000 and into a key-value-like stream (max_msgs_per_subject 1, 100
// keys overwritten in turn), once with chunks of pg.ChunkRowsDefault, the size every stream
// took before chunk sizes followed the limits, and once with the size the configuration
// chooses, in the same run. It reports the publish rate, how many chunks the stream opened,
// the most rows its chunk tables held (sampled every 100 ms) and what they held once the
// maintainer had dropped the chunks the first sequence passed.
//
//	go test -bench ChunkSizes -run xxx -benchtime 1x ./bridge/
//
// JETGRES_CHUNK_MSGS sets the messages per case (default 300,000); JETGRES_CHUNK_ROWS adds
// chunk sizes to compare (a comma-separated list); JETGRES_CHUNK_ROUNDS runs every case that
// many times, in turns (default 1).
func BenchmarkChunkSizes(b *testing.B) {
	n := envCount(b, "JETGRES_CHUNK_MSGS", 300_000)
	sizes := []int64{pg.ChunkRowsDefault, 0}
	if v := os.Getenv("JETGRES_CHUNK_ROWS"); v != "" {
		for f := range strings.SplitSeq(v, ",") {
			rows, err := strconv.ParseInt(f, 10, 64)
			if err != nil || rows <= 0 {
				b.Fatalf("JETGRES_CHUNK_ROWS=%q: want positive numbers", v)
			}
			sizes = append(sizes, rows)
		}
	}
	// Rounds take the cases in turn, so that a change in the machine's load falls on all.
	for range envCount(b, "JETGRES_CHUNK_ROUNDS", 1) {
		for _, ls := range []limitedStream{maxMsgsStream, kvStream} {
			for _, rows := range sizes {
				name := fmt.Sprintf("%s/chunk=%d", ls.name, rows)
				if rows == 0 {
					name = ls.name + "/chunk=chosen"
				}
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						benchChunkSize(b, ls, rows, n)
					}
				})
			}
		}
	}
}

func benchChunkSize(b *testing.B, ls limitedStream, rows int64, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tb := setup(b)
	if _, err := tb.js.CreateStream(ctx, ls.cfg); err != nil {
		b.Fatal(err)
	}
	s := tb.bridge.streams.Lookup(ls.cfg.Name)
	s.SetChunkRows(rows)
	db := rawsql.Open(b, tb.dbURL)
	var most int64
	sctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if r, _, err := streamRows(sctx, db, s.ID()); err == nil {
				most = max(most, r)
			}
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	took := publishLimited(b, ctx, tb, ls, n)
	stop()
	<-sampled
	var held, opened int64
	testwait.For(b, time.Minute, func() error {
		var err error
		if held, opened, err = streamRows(ctx, db, s.ID()); err != nil {
			return err
		}
		if bound := int64(ls.live) + s.ChunkRows(); held > bound {
			return fmt.Errorf("%d rows held, want at most %d", held, bound)
		}
		return nil
	})
	b.ReportMetric(float64(n)/took.Seconds(), "msgs/s")
	b.ReportMetric(float64(opened+1), "chunks")
	b.ReportMetric(float64(most), "rows-max")
	b.ReportMetric(float64(held), "rows-after")
	b.Logf("%s, chunks of %d rows: %d messages in %v, %.0f msgs/s; %d chunks; rows held: %d at most, %d after",
		ls.name, s.ChunkRows(), n, took.Round(time.Millisecond), float64(n)/took.Seconds(), opened+1, most, held)
}

// waitTicking waits for cond, moving clk on by a second before each look, by extra at most:
// the maintainer runs on clk's ticker, and what a pass left undone (a detach that gave up
// behind another transaction) waits for a later tick.
func waitTicking(t testing.TB, clk *clocktest.Fake, extra time.Duration, cond func() error) {
	t.Helper()
	var moved time.Duration
	testwait.For(t, time.Minute, func() error {
		if moved < extra {
			clk.Advance(time.Second)
			moved += time.Second
		}
		return cond()
	})
}

// A slow stream limited by max_age alone has its chunk closed once it holds pg.ChunkRowsMin
// messages and is a quarter of max_age old, so that its expired messages go with their
// chunk while newer ones live on: with chunks filled to their rows alone, it kept them.
func TestMaxAgeClosesChunksByAge(t *testing.T) {
	t.Parallel()
	clk := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clk }})
	ctx := testContext(t)
	ls := limitedStream{cfg: jetstream.StreamConfig{Name: "AGE", Subjects: []string{"age.>"}, MaxAge: 8 * time.Minute},
		subject: func(int) string { return "age.x" }}
	if _, err := tb.js.CreateStream(ctx, ls.cfg); err != nil {
		t.Fatal(err)
	}
	id := tb.bridge.streams.Lookup("AGE").ID()
	db := rawsql.Open(t, tb.dbURL)
	// advance moves the clock by d a second at a time, so that the maintainer's ticker
	// fires at each, and waits until the stream holds rows and has opened chunk.
	advance := func(d time.Duration, what string, wantRows, wantChunk int64) {
		t.Helper()
		for range int(d / time.Second) {
			clk.Advance(time.Second)
		}
		waitTicking(t, clk, time.Minute, func() error {
			rows, chunk, err := streamRows(ctx, db, id)
			if err != nil {
				return err
			}
			if rows != wantRows || chunk != wantChunk {
				return fmt.Errorf("%s: %d rows, chunk %d; want %d rows, chunk %d", what, rows, chunk, wantRows, wantChunk)
			}
			return nil
		})
	}
	// The whole test stays within 12 minutes of the clock: the ownership session confirms
	// itself every 12 minutes on the lease of a test on a fake clock, and measures the clock
	// against PostgreSQL's then, which would move the times stored after it back onto
	// PostgreSQL's clock, minutes before those stored so far.
	publishLimited(t, ctx, tb, ls, pg.ChunkRowsMin)
	advance(3*time.Minute, "past a quarter of max_age", pg.ChunkRowsMin, 1)
	publishLimited(t, ctx, tb, ls, 10)
	advance(5*time.Minute+30*time.Second, "once the first messages expired", 10, 1)
}
