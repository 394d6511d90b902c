package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestNumPendingWithReplicas runs two bridges on one database and publishes through both in
// turn, so that every commit either one makes leaves a gap the other filled: the consumer's
// num_pending must count every message whichever replica stored it, in its info, in each
// delivery's reply subject and in /metrics.
func TestNumPendingWithReplicas(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
	ctx := testContext(t)
	s := newStream(t, ctx, a, "NPR", "npr.>")
	b := setup(t, setupOpts{db: a.db, config: func(c *Config) { c.ReplicaName = "b" }})
	testwait.For(t, 5*time.Second, func() error {
		_, err := b.js.Stream(ctx, "NPR")
		return err
	})
	publish := func(n int) {
		t.Helper()
		for i := range n {
			tb := a
			if i%2 == 0 {
				tb = b
			}
			if _, err := tb.js.Publish(ctx, "npr.x", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// a stores 2, 4 and 6; b the rest, the last one included.
	publish(7)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.CachedInfo().NumPending; n != 7 {
		t.Fatalf("created with %d pending, want 7", n)
	}
	wantPending(t, ctx, c, 7)
	wantPendingMetric(t, a.reg, 7)

	batch, err := c.Fetch(4, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var left []uint64
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		left = append(left, md.NumPending)
	}
	if fmt.Sprint(left) != "[6 5 4 3]" {
		t.Fatalf("deliveries reported %v pending, want [6 5 4 3]", left)
	}
	wantPending(t, ctx, c, 3)
	wantPendingMetric(t, a.reg, 3)

	// Commits made elsewhere while nothing waits at the consumer: its info counts them at
	// once, its own count within a tick.
	publish(5)
	wantPending(t, ctx, c, 8)
	wantPendingMetric(t, a.reg, 8)
	md := fetchOne(t, c)
	if md.Sequence.Stream != 5 || md.NumPending != 7 {
		t.Fatalf("delivered %d with %d pending, want 5 with 7", md.Sequence.Stream, md.NumPending)
	}
}

func fetchOne(t *testing.T, c jetstream.Consumer) *jetstream.MsgMetadata {
	t.Helper()
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var mds []*jetstream.MsgMetadata
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		mds = append(mds, md)
	}
	if len(mds) != 1 {
		t.Fatalf("fetched %d messages, want 1: %v", len(mds), batch.Error())
	}
	return mds[0]
}

func wantPending(t *testing.T, ctx context.Context, c jetstream.Consumer, want uint64) {
	t.Helper()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != want {
		t.Fatalf("info reports %d pending, want %d", info.NumPending, want)
	}
}

// wantPendingMetric waits a few ticks at most for the consumer's own count, which /metrics
// reports, to reach want.
func wantPendingMetric(t *testing.T, reg *prometheus.Registry, want float64) {
	t.Helper()
	testwait.For(t, 2*TickIdleMaxDefault+time.Second, func() error {
		mfs, err := reg.Gather()
		if err != nil {
			return err
		}
		for _, mf := range mfs {
			if mf.GetName() == "jetgres_consumer_pending_messages" && len(mf.GetMetric()) == 1 {
				if got := mf.GetMetric()[0].GetGauge().GetValue(); got != want {
					return fmt.Errorf("/metrics reports %v pending, want %v", got, want)
				}
				return nil
			}
		}
		return fmt.Errorf("no pending gauge")
	})
}
