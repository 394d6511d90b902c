package pg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkAppendManyStreams runs closed-loop appenders of one message each over 256
// streams, as the overload sweep's synchronous publishers make the bridge do when each flush
// holds one stream: appender i owns the streams i, i+n, i+2n, … and takes them in turn, so
// that no two append to one stream at once and every connection sees every stream. Beside it,
// in the same run and at the same counts, on streams of their own: the floor, the least SQL a
// dense per-stream sequence needs per publish on this schema (FloorAppend: the state row
// advanced and the row inserted in one implicit transaction), the insert alone into the
// streams' chunk tables (ChunkInsert: many tables without a state row), and the naive INSERT
// into one table committed on its own. Only package pg is in the path: what it shows below
// the naive INSERT is the append's own or the schema's, not the bridge's. The test cluster
// runs with fsync off; point JETGRES_TEST_DATABASE_URL at a durable server to include the
// WAL flush.
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
			floorIDs := make([]int64, len(ids))
			chunkIDs := make([]int64, len(ids))
			for i := range ids {
				for _, x := range []struct {
					name string
					id   *int64
				}{{"F", &floorIDs[i]}, {"C", &chunkIDs[i]}} {
					st, err := db.CreateStream(ctx, fmt.Sprintf("%s%d", x.name, i), []byte(`{}`))
					if err != nil {
						b.Fatal(err)
					}
					*x.id = st.ID
				}
			}
			chunkSeqs := make([]atomic.Int64, len(ids))
			naive, err := pgtest.OpenNaive(ctx, url, int(pg.MaxConnsDefault))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(naive.Close)
			if err := naive.Reset(ctx); err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 128)
			run := func(op func(i, k int) error) float64 { return pgtest.ClosedLoop(b, n, b.N, op) }
			jg := run(func(i, k int) error {
				_, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: ids[(i+n*k)%len(ids)], Msgs: []pg.AppendMsg{{Subject: "m.x", Data: data}}}}, time.Now().UnixNano())
				return err
			})
			floor := run(func(i, k int) error {
				return db.FloorAppend(ctx, floorIDs[(i+n*k)%len(ids)], "m.x", data)
			})
			chunks := run(func(i, k int) error {
				j := (i + n*k) % len(ids)
				return db.ChunkInsert(ctx, chunkIDs[j], chunkSeqs[j].Add(1), "m.x", data)
			})
			nv := run(func(i, _ int) error { return naive.Insert(ctx, "m.x", data) })
			b.ReportMetric(jg, "append/s")
			b.ReportMetric(floor, "floor/s")
			b.ReportMetric(chunks, "chunks/s")
			b.ReportMetric(nv, "naive/s")
			b.ReportMetric(jg/nv, "x_naive")
			b.ReportMetric(jg/floor, "x_floor")
			b.ReportMetric(floor/nv, "floor_x_naive")
		})
	}
}
