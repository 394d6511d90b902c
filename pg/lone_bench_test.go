package pg_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkAppendLone appends one message at a time, as a lone synchronous publisher makes
// the bridge do, and reports its median against the median of a bare INSERT committed on
// its own, interleaved so both see the same machine. Point it at a cluster with fsync on
// (JETGRES_TEST_DATABASE_URL) for numbers a PubAck would see.
func BenchmarkAppendLone(b *testing.B) {
	const rounds = 2000
	ctx := context.Background()
	url := pgtest.NewDB(b)
	db, err := pg.Open(ctx, pg.Config{URL: url})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	naive, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { naive.Close(ctx) })
	if _, err := naive.Exec(ctx, `CREATE TABLE naive (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	st, err := db.CreateStream(ctx, "LONE", []byte(`{}`))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	var appends, inserts []time.Duration
	for b.Loop() {
		appends, inserts = appends[:0], inserts[:0]
		for range rounds {
			t0 := time.Now()
			if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "lone.x", Data: data}}}}, time.Now().UnixNano()); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := naive.Exec(ctx, `INSERT INTO naive (subject, data) VALUES ($1, $2)`, "lone.x", data); err != nil {
				b.Fatal(err)
			}
			appends, inserts = append(appends, t1.Sub(t0)), append(inserts, time.Since(t1))
		}
	}
	slices.Sort(appends)
	slices.Sort(inserts)
	b.ReportMetric(float64(appends[rounds/2].Microseconds()), "append-µs")
	b.ReportMetric(float64(inserts[rounds/2].Microseconds()), "insert-µs")
	b.ReportMetric(float64(appends[rounds/2])/float64(inserts[rounds/2]), "append/insert")
}
