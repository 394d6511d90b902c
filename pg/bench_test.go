package pg_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkAppendHotKey puts one key of a key-value-like stream (one message per subject)
// 4,000 times, each put tombstoning the last, and reports the median put near the end
// against the median of the first ones. It stays near 1 only if finding a subject's live
// rows does not read its tombstones: run it with -benchtime 1x.
func BenchmarkAppendHotKey(b *testing.B) {
	const puts, window = 4000, 300
	ctx := context.Background()
	db := pgtest.Open(b)
	data := make([]byte, 128)
	var ratios []float64
	for b.Loop() {
		st, err := db.CreateStream(ctx, "HOT", []byte(`{}`))
		if err != nil {
			b.Fatal(err)
		}
		var early, late []time.Duration
		for i := range puts {
			t0 := time.Now()
			_, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Limits: pg.Limits{MaxMsgsPer: 1},
				Msgs: []pg.AppendMsg{{Subject: "kv.hot", Data: data}}}}, time.Now().UnixNano())
			if err != nil {
				b.Fatal(err)
			}
			switch d := time.Since(t0); {
			case i < window:
				early = append(early, d)
			case i >= puts-window:
				late = append(late, d)
			}
		}
		slices.Sort(early)
		slices.Sort(late)
		ratios = append(ratios, float64(late[window/2])/float64(early[window/2]))
		if err := db.DeleteStream(ctx, st.ID); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "late/early")
}

// BenchmarkReadFreshChunk reads 1,000 messages at a time from the middle of a 60,000-row
// chunk that has never been analyzed, as every chunk is while it fills, and again after
// ANALYZE, and reports the ratio of the total times. It stays near 1 only if a read's cost
// does not hang on the planner's row estimates (PostgreSQL plans a prepared statement's
// first five executions with the values given, and those are the ones that go wrong): run
// it with -benchtime 1x.
func BenchmarkReadFreshChunk(b *testing.B) {
	const rows, batch, reads = 60000, 1000, 20
	ctx := context.Background()
	db := pgtest.Open(b)
	data := make([]byte, 128)
	var ratios []float64
	for b.Loop() {
		st, err := db.CreateStream(ctx, "FRESH", []byte(`{}`))
		if err != nil {
			b.Fatal(err)
		}
		msgs := make([]pg.AppendMsg, batch)
		for i := range msgs {
			msgs[i] = pg.AppendMsg{Subject: "fresh.x", Data: data}
		}
		for range rows / batch {
			if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
				b.Fatal(err)
			}
		}
		readAll := func() time.Duration {
			t0 := time.Now()
			for i := range reads {
				got, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: uint64(20000 + i*batch), UpTo: rows, MaxMsgs: batch}, nil)
				if err != nil || len(got) != batch {
					b.Fatalf("read %d messages: %v", len(got), err)
				}
			}
			return time.Since(t0)
		}
		fresh := readAll()
		if err := db.Background(ctx, func(ctx context.Context, q pg.Querier) error {
			_, err := q.Exec(ctx, fmt.Sprintf(`ANALYZE jetgres.msgs_%d_0`, st.ID))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		ratios = append(ratios, float64(fresh)/float64(readAll()))
		if err := db.DeleteStream(ctx, st.ID); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "fresh/analyzed")
}
