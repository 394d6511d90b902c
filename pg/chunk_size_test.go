package pg_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// A stream's chunks are a quarter of the most messages its limits let it hold, within
// pg.ChunkRowsMin and pg.ChunkRowsDefault, as nats-server sizes a file store's blocks: its
// appends open chunks of at least pg.ChunkRowsAppendMin, and the maintainer closes them at
// the smaller size.
func TestChunkRowsForFollowsLimits(t *testing.T) {
	const appendMin = pg.ChunkRowsAppendMin
	for _, c := range []struct {
		name          string
		in            pg.ChunkSizing
		rows, closeAt int64
	}{
		{"no limits", pg.ChunkSizing{}, pg.ChunkRowsDefault, 0},
		{"max_msgs 1000", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 1000}}, appendMin, pg.ChunkRowsMin},
		{"max_msgs 40,000", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 40_000}}, appendMin, 10_001},
		{"max_msgs 100,000", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 100_000}}, 25_001, 0},
		{"max_msgs 10 million", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 10_000_000}}, pg.ChunkRowsDefault, 0},
		{"discard new too", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 100_000, DiscardNew: true}}, 25_001, 0},
		{"max_bytes 16 MiB", pg.ChunkSizing{Limits: pg.Limits{MaxBytes: 16 << 20}}, 16<<20/128/4 + 1, 0},
		{"max_bytes 16 MiB of messages up to 1 KiB", pg.ChunkSizing{Limits: pg.Limits{MaxBytes: 16 << 20}, MaxMsgSize: 1024}, appendMin, 16<<20/1024/4 + 1},
		{"the smaller of max_msgs and max_bytes", pg.ChunkSizing{Limits: pg.Limits{MaxMsgs: 80_000, MaxBytes: 1 << 30}}, 20_001, 0},
		{"key-value bucket", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 1}}, appendMin, pg.ChunkRowsMin},
		{"key-value bucket with max_bytes", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 5, MaxBytes: 1 << 30}}, appendMin, pg.ChunkRowsMin},
		{"per subject over 40,000 literal subjects", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 2}, Subjects: 40_000}, 20_001, 0},
		{"per subject with max_msgs smaller", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: 2, MaxMsgs: 60_000}, Subjects: 40_000}, appendMin, 15_001},
		{"per subject past int64", pg.ChunkSizing{Limits: pg.Limits{MaxMsgsPer: math.MaxInt64 / 2}, Subjects: 3}, pg.ChunkRowsDefault, 0},
	} {
		if got := pg.ChunkRowsFor(c.in); got != c.rows {
			t.Errorf("%s: chunks of %d rows, want %d", c.name, got, c.rows)
		}
		if got := pg.ChunkRowsClose(c.in); got != c.closeAt {
			t.Errorf("%s: closed at %d rows, want %d", c.name, got, c.closeAt)
		}
	}
}

// A stream's chunk is closed once it holds the rows asked for and began before the bound
// given; not before, and not twice.
func TestCloseChunks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "AGED", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	young, err := db.CreateStream(ctx, "YOUNG", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour)
	appendN := func(id int64, n int, ts time.Time) {
		t.Helper()
		msgs := make([]pg.AppendMsg, n)
		for i := range msgs {
			msgs[i] = pg.AppendMsg{Subject: "a.x", Data: []byte("d")}
		}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: id, Msgs: msgs}}, ts.UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	const rows = 100
	closeChunks := func(want int, before time.Time) {
		t.Helper()
		got, err := db.CloseChunks(ctx, []pg.ChunkClose{{StreamID: st.ID, Rows: rows, Before: before.UnixNano()},
			{StreamID: young.ID, Rows: rows, Before: before.UnixNano()}})
		if err != nil || got != want {
			t.Fatalf("closed %d (%v), want %d", got, err, want)
		}
	}
	appendN(st.ID, rows-1, t0)
	appendN(young.ID, rows, t0.Add(time.Minute))
	closeChunks(0, t0.Add(time.Second))
	appendN(st.ID, 1, t0.Add(2*time.Second))
	closeChunks(0, t0.Add(-time.Second))
	closeChunks(1, t0.Add(time.Second))
	closeChunks(0, t0.Add(time.Second))
	appendN(st.ID, 5, t0.Add(3*time.Second))
	for _, seq := range []uint64{rows, rows + 1, rows + 5} {
		if m, err := db.GetMessage(ctx, st.ID, seq); err != nil || m.Seq != seq {
			t.Fatalf("message %d, across the closing: %+v %v", seq, m, err)
		}
	}
	closeChunks(1, t0.Add(2*time.Minute))
}

// BenchmarkChunkTurnover appends batches of 256 messages of 128 bytes, one at a time, into a
// stream limited to max_msgs 1000, while a maintainer drops every 100 ms the chunks its first
// sequence passed: with chunks of pg.ChunkRowsDefault, and of the size ChunkRowsFor chooses,
// in turns. It reports the publish rate, the median append that opened a chunk and the median
// one that did not (their difference is what a chunk's DDL costs the append path, under the
// stream's row lock), and the mean drop of a chunk by the maintainer.
//
//	go test -bench ChunkTurnover -run xxx -benchtime 2000x ./pg/
//
// JETGRES_CHUNK_ROWS adds chunk sizes to compare (multiples of 256, comma-separated);
// JETGRES_CHUNK_ROUNDS runs every size that many times, in turns (default 1).
func BenchmarkChunkTurnover(b *testing.B) {
	lim := pg.Limits{MaxMsgs: 1000}
	rounds := 1
	if v := os.Getenv("JETGRES_CHUNK_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("JETGRES_CHUNK_ROUNDS=%q: want a positive number", v)
		}
		rounds = n
	}
	sizes := []int64{pg.ChunkRowsDefault, pg.ChunkRowsFor(pg.ChunkSizing{Limits: lim})}
	if v := os.Getenv("JETGRES_CHUNK_ROWS"); v != "" {
		for f := range strings.SplitSeq(v, ",") {
			rows, err := strconv.ParseInt(f, 10, 64)
			if err != nil || rows <= 0 || rows%256 != 0 {
				b.Fatalf("JETGRES_CHUNK_ROWS=%q: want positive multiples of 256", v)
			}
			sizes = append(sizes, rows)
		}
	}
	for range rounds {
		for _, rows := range sizes {
			b.Run(fmt.Sprintf("chunk=%d", rows), func(b *testing.B) { chunkTurnover(b, lim, rows) })
		}
	}
}

func chunkTurnover(b *testing.B, lim pg.Limits, rows int64) {
	const batch = 256
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.Open(b)
	st, err := db.CreateStream(ctx, "TURN", []byte(`{}`))
	if err != nil {
		b.Fatal(err)
	}
	var dropTime time.Duration
	var drops int
	maintained := make(chan struct{})
	go func() {
		defer close(maintained)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			t0 := time.Now()
			n, err := db.DropChunks(ctx, st.ID, time.Hour)
			if err != nil && ctx.Err() == nil {
				b.Error(err)
				return
			}
			if n > 0 {
				dropTime += time.Since(t0)
				drops += n
			}
		}
	}()
	msgs := make([]pg.AppendMsg, batch)
	for i := range msgs {
		msgs[i] = pg.AppendMsg{Subject: "turn.x", Data: make([]byte, 128)}
	}
	var opening, plain []time.Duration
	i := 0
	for b.Loop() {
		t0 := time.Now()
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: rows, Limits: lim, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
		if d := time.Since(t0); i > 0 && int64(i*batch)%rows == 0 {
			opening = append(opening, d)
		} else {
			plain = append(plain, d)
		}
		i++
	}
	elapsed := b.Elapsed()
	cancel()
	<-maintained
	median := func(ds []time.Duration) float64 {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1000
	}
	b.ReportMetric(float64(i*batch)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(median(opening), "ms/opening-append")
	b.ReportMetric(median(plain), "ms/append")
	if drops > 0 {
		b.ReportMetric(float64(dropTime.Microseconds())/1000/float64(drops), "ms/drop")
	}
	b.ReportMetric(float64(len(opening)), "chunks-opened")
}
