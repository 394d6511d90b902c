package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// A message published from SQL is stored under its stream's subject_transform, as a NATS
// publish is, and republished once it is moved into the stream.
func TestSQLPublishTransformedAndRepublished(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SX", Subjects: []string{"sx.>"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: "sx.*", Destination: "stored.{{wildcard(1)}}"},
		RePublish:        &jetstream.RePublish{Source: "stored.>", Destination: "out.>"}})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tb.nc.SubscribeSync("out.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	raw := rawsql.Open(t, tb.dbURL)
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		return rawsql.Publish(ctx, q, "sx.a", "from sql", `{}`)
	})
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("republished: %v", err)
	}
	if m.Subject != "out.a" || m.Header.Get(jetstream.SubjectHeader) != "stored.a" || string(m.Data) != "from sql" {
		t.Fatalf("republished %s %v %q", m.Subject, m.Header, m.Data)
	}
	testwait.For(t, 5*time.Second, func() error {
		got, err := s.GetMsg(ctx, 1)
		if err != nil {
			return err
		}
		if got.Subject != "stored.a" {
			return fmt.Errorf("stored under %q, want stored.a", got.Subject)
		}
		return nil
	})
}
