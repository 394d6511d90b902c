package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// An increment published with jetgres.publish in an application's transaction adds to the
// counter as one published over NATS does, before and after it; one without Nats-Incr is
// refused and counted, as a NATS publish without it is answered 10169.
func TestSQLPublishCounter(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "CTR", Subjects: []string{"ctr.>"}, AllowMsgCounter: true})
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := tb.js.PublishMsg(ctx, incrMsg("ctr.a", "5")); err != nil || ack.Value != "5" {
		t.Fatalf("first increment: %+v, %v", ack, err)
	}
	raw := rawsql.Open(t, tb.dbURL)
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		if err := rawsql.Publish(ctx, q, "ctr.a", "", `{"Nats-Incr": "3"}`); err != nil {
			return err
		}
		if err := rawsql.Publish(ctx, q, "ctr.a", "no increment", `{"X": "y"}`); err != nil {
			return err
		}
		return rawsql.Publish(ctx, q, "ctr.a", "", `{"Nats-Incr": "-1"}`)
	})
	testwait.For(t, 10*time.Second, func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 3 {
			return fmt.Errorf("stream holds %d messages, want 3", info.State.Msgs)
		}
		return nil
	})
	testwait.For(t, 10*time.Second, func() error {
		if n := reasonCount(t, tb.reg, "jetgres_sql_publish_refused_total", stream.ReasonExpected); n != 1 {
			return fmt.Errorf("refused publishes counted %v, want 1", n)
		}
		return nil
	})
	if ack, err := tb.js.PublishMsg(ctx, incrMsg("ctr.a", "10")); err != nil || ack.Value != "17" {
		t.Fatalf("increment after the SQL ones: %+v, %v", ack, err)
	}
}
