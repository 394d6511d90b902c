package bridge

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkLonePublish measures a lone synchronous publisher through the whole path (client,
// NATS server, link, bridge, PostgreSQL and back) against a bare INSERT committed on its own
// (pgtest.VersusInsert).
func BenchmarkLonePublish(b *testing.B) {
	tb := setup(b)
	if _, err := tb.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "LONE", Subjects: []string{"lone.>"}}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	pgtest.VersusInsert(b, "publish", 2000, func(ctx context.Context) error {
		_, err := tb.js.Publish(ctx, "lone.x", data)
		return err
	})
}
