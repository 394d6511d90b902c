package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// publishN publishes n messages to subject, numbered from 1 in the payload.
func publishN(t *testing.T, ctx context.Context, js jetstream.JetStream, subject string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, "%d", i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
}

func newStream(t *testing.T, ctx context.Context, tb *testBundle, name string, subjects ...string) jetstream.Stream {
	t.Helper()
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	return s
}

func TestFetchAndAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "ORDERS", "orders.>")
	publishN(t, ctx, tb.js, "orders.new", 10)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C1", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	info := c.CachedInfo()
	if info.Config.AckWait != 30*time.Second || info.Config.MaxAckPending != 1000 || info.Config.MaxWaiting != 512 || info.Config.MaxDeliver != -1 {
		t.Fatalf("defaults not echoed: %+v", info.Config)
	}
	if info.NumPending != 10 {
		t.Fatalf("num_pending = %d, want 10", info.NumPending)
	}
	batch, err := c.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject() != "orders.new" || string(m.Data()) != fmt.Sprint(n) || md.Sequence.Stream != uint64(n) || md.Sequence.Consumer != uint64(n) || md.NumPending != uint64(10-n) {
			t.Fatalf("message %d: subject %q data %q meta %+v", n, m.Subject(), m.Data(), md)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatalf("double ack %d: %v", n, err)
		}
	}
	if batch.Error() != nil || n != 10 {
		t.Fatalf("fetched %d, err %v", n, batch.Error())
	}
	info, err = c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 10 || info.Delivered.Stream != 10 || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Fatalf("info after acks: %+v", info)
	}
	row, err := tb.db.GetConsumer(ctx, mustStreamID(t, tb, "ORDERS"), "C1")
	if err != nil || row.AckStreamSeq != 10 || row.AckConsumerSeq != 10 {
		t.Fatalf("stored cursor %+v, %v", row, err)
	}
}

func mustStreamID(t *testing.T, tb *testBundle, name string) int64 {
	t.Helper()
	s := tb.bridge.lookup(name)
	if s == nil {
		t.Fatalf("no stream %s", name)
	}
	return s.id
}
