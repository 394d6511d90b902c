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

// BenchmarkAppendFused times one fused append of 256 messages, as a flush under load hands
// it over: one message in each of 256 streams, against all 256 in one stream, alternated in
// the same run. What the first costs above the second is what a stream costs a fused
// transaction: its state row's lock and update, and PostgreSQL's routing of a row into one
// more partition (opening it and its indexes, and their locks), which is most of it.
func BenchmarkAppendFused(b *testing.B) {
	ctx := context.Background()
	db := pgtest.Open(b)
	ids := make([]int64, 256)
	for i := range ids {
		st, err := db.CreateStream(ctx, fmt.Sprintf("F%d", i), []byte(`{}`))
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = st.ID
	}
	msg := pg.AppendMsg{Subject: "m.x", Data: make([]byte, 128)}
	spread := make([]pg.AppendBatch, len(ids))
	for i, id := range ids {
		spread[i] = pg.AppendBatch{StreamID: id, Msgs: []pg.AppendMsg{msg}}
	}
	one := make([]pg.AppendMsg, len(ids))
	for i := range one {
		one[i] = msg
	}
	alone := []pg.AppendBatch{{StreamID: ids[0], Msgs: one}}
	var took [2]time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if _, _, err := db.Append(ctx, [][]pg.AppendBatch{spread, alone}[i%2], time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
		took[i%2] += time.Since(start)
	}
	streams, stream := float64(took[0].Microseconds())/float64((b.N+1)/2), float64(took[1].Microseconds())/max(float64(b.N/2), 1)
	b.ReportMetric(streams/1e3, "ms/256streams")
	b.ReportMetric(stream/1e3, "ms/1stream")
	b.ReportMetric((streams-stream)/255, "us/extra_stream")
}
