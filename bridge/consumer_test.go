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

// TestCursorWritesPaced acks messages one by one with plain acks: the floor moves with each,
// but the cursor is written at most once per cursorPace, and once the acks stop the last
// floor still reaches PostgreSQL. A double ack is not paced: when it returns, its floor is
// stored.
func TestCursorWritesPaced(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "PACED", "paced.>")
	const n = 2000
	publishN(t, ctx, tb.js, "paced.x", n)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	id := mustStreamID(t, tb, "PACED")
	before := counterValue(t, tb.reg, "jetgres_cursor_writes_total")
	start := time.Now()
	for got := 0; got < n-1; {
		batch, err := c.Fetch(min(100, n-1-got), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("fetch after %d: %v", got, err)
		}
	}
	if err := tb.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() error {
		row, err := tb.db.GetConsumer(ctx, id, "C")
		if err == nil && row.AckStreamSeq != n-1 {
			err = fmt.Errorf("stored floor %d, want %d", row.AckStreamSeq, n-1)
		}
		return err
	})
	elapsed := time.Since(start)
	writes := counterValue(t, tb.reg, "jetgres_cursor_writes_total") - before
	if limit := 2 + float64(elapsed/cursorPace); writes > limit {
		t.Errorf("%g cursor writes for %d acks in %s, want at most %g", writes, n-1, elapsed, limit)
	}

	m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if row, err := tb.db.GetConsumer(ctx, id, "C"); err != nil || row.AckStreamSeq != n {
		t.Fatalf("stored cursor after a double ack: %+v, %v", row, err)
	}
}
