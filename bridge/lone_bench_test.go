package bridge

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkLonePublish measures a lone synchronous publisher through the whole path (client,
// NATS server, link, bridge, PostgreSQL and back) against a bare INSERT committed on its own
// in the same cluster, interleaved so both see the same machine, and reports the ratio of
// their medians. Point it at a cluster with fsync on (JETGRES_TEST_DATABASE_URL) for the
// numbers a PubAck would see.
func BenchmarkLonePublish(b *testing.B) {
	const rounds = 2000
	tb := setup(b)
	ctx := context.Background()
	naive, err := pgx.Connect(ctx, pgtest.NewDB(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { naive.Close(ctx) })
	if _, err := naive.Exec(ctx, `CREATE TABLE naive (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, subject text NOT NULL, data bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "LONE", Subjects: []string{"lone.>"}}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	var pubs, inserts []time.Duration
	for b.Loop() {
		pubs, inserts = pubs[:0], inserts[:0]
		for range rounds {
			t0 := time.Now()
			if _, err := tb.js.Publish(ctx, "lone.x", data); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := naive.Exec(ctx, `INSERT INTO naive (subject, data) VALUES ($1, $2)`, "lone.x", data); err != nil {
				b.Fatal(err)
			}
			pubs, inserts = append(pubs, t1.Sub(t0)), append(inserts, time.Since(t1))
		}
	}
	slices.Sort(pubs)
	slices.Sort(inserts)
	b.ReportMetric(float64(pubs[rounds/2].Microseconds()), "publish-µs")
	b.ReportMetric(float64(inserts[rounds/2].Microseconds()), "insert-µs")
	b.ReportMetric(float64(pubs[rounds/2])/float64(inserts[rounds/2]), "publish/insert")
}
