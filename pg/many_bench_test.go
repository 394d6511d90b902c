package pg_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkAppendManyStreams runs closed-loop appenders of one message each over 256
// streams, as the overload sweep's synchronous publishers make the bridge do when each flush
// holds one stream: appender i owns the streams i, i+n, i+2n, … and takes them in turn, so
// that no two append to one stream at once and every connection sees every stream, beside as many naive INSERTs committed on
// their own, in the same run. Only package pg is in the path: what it shows below the naive
// INSERT is the append's own, not the bridge's.
func BenchmarkAppendManyStreams(b *testing.B) {
	for _, n := range []int{8, 32} {
		b.Run(fmt.Sprintf("appenders=%d", n), func(b *testing.B) {
			ctx := context.Background()
			url := pgtest.NewDB(b)
			db := pgtest.OpenAt(b, url)
			ids := make([]int64, 256)
			for i := range ids {
				st, err := db.CreateStream(ctx, fmt.Sprintf("S%d", i), []byte(`{}`))
				if err != nil {
					b.Fatal(err)
				}
				ids[i] = st.ID
			}
			naive, err := pgtest.OpenNaive(ctx, url, int(pg.MaxConnsDefault))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(naive.Close)
			if err := naive.Reset(ctx); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 128)
			run := func(op func(i, k int) error) float64 {
				var next atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for i := range n {
					wg.Go(func() {
						for k := 0; next.Add(1) <= int64(b.N); k++ {
							if err := op(i, k); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				return float64(b.N) / time.Since(start).Seconds()
			}
			jg := run(func(i, k int) error {
				_, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: ids[(i+n*k)%len(ids)], Msgs: []pg.AppendMsg{{Subject: "m.x", Data: data}}}}, time.Now().UnixNano())
				return err
			})
			nv := run(func(i, _ int) error { return naive.Insert(ctx, "m.x", data) })
			b.ReportMetric(jg, "append/s")
			b.ReportMetric(nv, "naive/s")
			b.ReportMetric(jg/nv, "x_naive")
		})
	}
}
