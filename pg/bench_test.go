package pg_test

import (
	"context"
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
