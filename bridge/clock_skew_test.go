package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// clockSkew is how far apart the replicas' clocks are in the tests below: five times the
// window of a forwarded request's seal.
const clockSkew = 5 * time.Minute

// Two replicas of one deployment, on one NATS server and one database, whose clocks are
// five minutes apart: a consumer that replica a serves is used through replica b (updated,
// asked for, fetched from and acked), b's requests forwarded to a with none refused; and
// the messages both store in turn carry times on PostgreSQL's clock, near the real time
// whichever replica stored them, that never go backwards along the stream. The replica whose
// clock is off PostgreSQL's shows it in /metrics and warns of it.
func TestReplicasWithSkewedClocks(t *testing.T) {
	t.Parallel()
	const msgs = 40
	clockA := clocktest.New()
	a := setup(t, setupOpts{config: func(c *Config) { c.ClusterName, c.ReplicaName, c.Clock = "skew", "a", clockA }})
	ctx := testContext(t)
	s := newStream(t, ctx, a, "SKEW", "skew.>")
	cfg := jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour}
	if _, err := s.CreateOrUpdateConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// b has a pool of its own, as a replica has: the offset to PostgreSQL's clock is a
	// pool's, measured against its replica's clock.
	clockB, logB := clocktest.At(time.Now().Add(clockSkew)), &syncbuf.Buffer{}
	b := setup(t, setupOpts{nats: a.nats, db: pgtest.OpenAt(t, a.dbURL), config: func(c *Config) {
		c.ClusterName, c.ReplicaName, c.Clock = "skew", "b", clockB
		c.Logger = slog.New(slog.NewTextHandler(logB, nil))
	}})
	testwait.For(t, 10*time.Second, func() error {
		if b.bridge.streams.Lookup("SKEW") == nil {
			return errors.New("b does not serve the stream yet")
		}
		return nil
	})

	// The stream's subjects are a queue group of both replicas: each stores some.
	for i := range msgs {
		if _, err := b.js.Publish(ctx, "skew.x", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*testBundle{a, b} {
		if n := counterValue(t, r.reg, "jetgres_publish_accepted_total"); n == 0 {
			t.Fatalf("replica %s stored none of the publishes: the test needs both", r.bridge.cfg.ReplicaName)
		}
	}

	// So is the API: b answers some of these, by forwarding them to a.
	cfg.Description = "updated through any replica"
	for i := range 20 {
		// A request refused is left unanswered: the client's own timeout ends it.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := b.js.CreateOrUpdateConsumer(rctx, "SKEW", cfg)
		if err != nil {
			cancel()
			t.Fatalf("update %d: %v", i, err)
		}
		c, err := b.js.Consumer(rctx, "SKEW", "C")
		cancel()
		if err != nil {
			t.Fatalf("info %d: %v", i, err)
		}
		if info := c.CachedInfo(); info.Config.Description != cfg.Description || info.Cluster == nil || info.Cluster.Leader != "a" {
			t.Fatalf("info %d: description %q, cluster %+v; want the update, served by a", i, info.Config.Description, info.Cluster)
		}
	}
	if n := counterValue(t, b.reg, "jetgres_consumer_requests_forwarded_total"); n == 0 {
		t.Fatal("b forwarded none of 40 consumer requests: the API queue group never picked it")
	}

	// a sees b's commits on its ticks, which its clock drives.
	testwait.For(t, 30*time.Second, func() error {
		clockA.Advance(TickIdleMaxDefault)
		if n := gaugeValue(t, a.reg, "jetgres_consumer_pending_messages"); n != msgs {
			return fmt.Errorf("a's consumer counts %v pending, want %d", n, msgs)
		}
		return nil
	})
	c, err := b.js.Consumer(ctx, "SKEW", "C")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(msgs, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	got := 0
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if md.Timestamp.Before(last) {
			t.Fatalf("message %d stored at %v, before the one before it at %v", md.Sequence.Stream, md.Timestamp, last)
		}
		if d := time.Since(md.Timestamp); d > time.Minute || d < -time.Minute {
			t.Fatalf("message %d stored at %v, %v from the real time: not on PostgreSQL's clock", md.Sequence.Stream, md.Timestamp, d)
		}
		last = md.Timestamp
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != msgs {
		t.Fatalf("fetched %d messages, want %d", got, msgs)
	}
	testwait.For(t, 10*time.Second, func() error {
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.AckFloor.Stream != msgs || info.NumAckPending != 0 {
			return fmt.Errorf("ack floor %d, %d ack pending; want %d, 0", info.AckFloor.Stream, info.NumAckPending, msgs)
		}
		return nil
	})
	for _, r := range []*testBundle{a, b} {
		for _, reason := range []string{ownership.RefusedSeal, ownership.RefusedClock} {
			if n := reasonCount(t, r.reg, "jetgres_consumer_forwards_refused_total", reason); n != 0 {
				t.Errorf("replica %s refused %v forwarded requests for their %s", r.bridge.cfg.ReplicaName, n, reason)
			}
		}
	}

	// b's ownership loop, on its next look, measures how far b's clock is from
	// PostgreSQL's, shows it in /metrics and warns of it.
	clockB.Advance(fakeClockLease / ownership.ClaimsPerLease)
	testwait.For(t, 10*time.Second, func() error {
		if off := gaugeValue(t, b.reg, "jetgres_clock_offset_seconds"); off > -clockSkew.Seconds() {
			return fmt.Errorf("b's /metrics shows PostgreSQL's clock %v s ahead of b's", off)
		}
		if !strings.Contains(logB.String(), "clock is far from PostgreSQL's") {
			return errors.New("b has not warned of its clock")
		}
		return nil
	})
}
