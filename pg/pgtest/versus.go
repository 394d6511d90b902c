package pgtest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// VersusInsert is a benchmark's baseline: it runs op rounds times per iteration, each run
// followed by a bare INSERT (BareInsert), and reports the medians of both and their ratio
// as "<what>/insert". The two are interleaved so that both see the same machine; point the
// tests at a cluster with fsync on (JETGRES_TEST_DATABASE_URL) for the latencies a client
// would see.
func VersusInsert(b *testing.B, what string, rounds int, op func(ctx context.Context) error) {
	b.Helper()
	ctx := context.Background()
	insert := BareInsert(b)
	data := make([]byte, 128)
	var ops, inserts []time.Duration
	for b.Loop() {
		ops, inserts = ops[:0], inserts[:0]
		for range rounds {
			t0 := time.Now()
			if err := op(ctx); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := insert(ctx, data); err != nil {
				b.Fatal(err)
			}
			ops, inserts = append(ops, t1.Sub(t0)), append(inserts, time.Since(t1))
		}
	}
	slices.Sort(ops)
	slices.Sort(inserts)
	op50, insert50 := Percentile(ops, 0.5), Percentile(inserts, 0.5)
	b.ReportMetric(float64(op50.Microseconds()), what+"-µs")
	b.ReportMetric(float64(insert50.Microseconds()), "insert-µs")
	b.ReportMetric(float64(op50)/float64(insert50), what+"/insert")
}

// ClosedLoop runs op total times from workers goroutines, each calling it again as soon as
// its last call returned (a closed-loop load, as synchronous publishers make), and returns
// the calls per second. op gets its worker's number and how many calls that worker made
// before; the first error ends its worker and fails tb.
func ClosedLoop(tb testing.TB, workers, total int, op func(worker, k int) error) float64 {
	tb.Helper()
	rate, _ := ClosedLoopLatency(tb, workers, total, op)
	return rate
}

// ClosedLoopLatency is ClosedLoop that also returns each call's duration, sorted.
func ClosedLoopLatency(tb testing.TB, workers, total int, op func(worker, k int) error) (rate float64, took []time.Duration) {
	tb.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	took = make([]time.Duration, total)
	start := time.Now()
	for i := range workers {
		wg.Go(func() {
			for k := 0; ; k++ {
				j := next.Add(1)
				if j > int64(total) {
					return
				}
				began := time.Now()
				if err := op(i, k); err != nil {
					tb.Error(err)
					return
				}
				took[j-1] = time.Since(began)
			}
		})
	}
	wg.Wait()
	rate = float64(total) / time.Since(start).Seconds()
	slices.Sort(took)
	return rate, took
}

// Percentile is the q-quantile (0 < q ≤ 1) of durations sorted in increasing order.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
