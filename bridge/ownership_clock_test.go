package bridge

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// ownershipLease is the lease of the tests below: long in real time, so that nothing they
// see comes from a real-time ticker while they run, and a fraction of it is all their fake
// clock moves at a time.
const ownershipLease = time.Hour

// The ownership loop confirms its session, and looks for consumers deleted without a
// notification, on the bridge's clock: a consumer whose row went behind PostgreSQL's back
// stops being served once a third of a lease of that clock has passed, however little real
// time went by.
func TestOwnershipLooksOnTheBridgeClock(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock, c.Lease = clock, ownershipLease }, unstarted: true})
	ctx := testContext(t)
	// Every notification is lost, not only the deletion's: one of the creation's arriving
	// after the deletion below would make the loop look at once.
	tb.bridge.onMeta = func(int64) {}
	if err := tb.bridge.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s := newStream(t, ctx, tb, "LOOK", "look")
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"}); err != nil {
		t.Fatal(err)
	}
	raw := rawsql.Open(t, tb.dbURL)
	if err := raw.Exec(ctx, `DELETE FROM jetgres.consumers WHERE name = 'C'`); err != nil {
		t.Fatal(err)
	}
	// Each step fires the ownership loop's tick. Waiting for the confirmation it makes keeps
	// the fence, on the same clock, from ever finding one older than a step.
	step := func() {
		t.Helper()
		clock.Advance(ownershipLease / ownership.ClaimsPerLease)
		testwait.For(t, 30*time.Second, func() error {
			if got, now := tb.bridge.cons.OwnershipConfirmed(), clock.Now(); got.Before(now) {
				return fmt.Errorf("ownership confirmed at %v, the clock is at %v", got, now)
			}
			return nil
		})
	}
	for range ownership.ClaimsPerLease/ownership.DeletedChecksPerLease - 1 {
		step()
		if !tb.bridge.cons.Holds("LOOK", "C") {
			t.Fatal("stopped before the ownership loop was due to look")
		}
	}
	step()
	step()
	testwait.For(t, 30*time.Second, func() error {
		if tb.bridge.cons.Holds("LOOK", "C") {
			return errors.New("the consumer deleted without a notification is still served")
		}
		return nil
	})
	if counterValue(t, tb.reg, "jetgres_consumer_fencings_total") != 0 {
		t.Fatal("the ownership loop fenced")
	}
}

// The fence measures on the bridge's clock: once the clock passes the fencing deadline
// faster than the ownership session can be confirmed, the bridge stops serving its
// consumers, however little real time went by.
func TestFenceOnTheBridgeClock(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock, c.Lease = clock, ownershipLease }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "FENCE", "fence")
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"}); err != nil {
		t.Fatal(err)
	}
	if !tb.bridge.cons.Holds("FENCE", "C") {
		t.Fatal("the bridge does not serve the consumer it created")
	}
	// One jump fires the ownership loop's tick and the fence's together; a confirmation that
	// gets in first only puts the fence off to the next jump.
	testwait.For(t, 30*time.Second, func() error {
		if counterValue(t, tb.reg, "jetgres_consumer_fencings_total") > 0 {
			return nil
		}
		clock.Advance(ownershipLease/ownership.FencePerLease + ownershipLease/ownership.ClaimsPerLease)
		return errors.New("not fenced")
	})
}

// A consumer deleted by another replica stops being served here once PostgreSQL notifies of
// the deletion, on a clock that stands still too: the notification makes the ownership loop
// look at once.
func TestOwnershipStopsAConsumerDeletedElsewhereOnAStillClock(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock, c.Lease = clock, ownershipLease }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "GONE", "gone")
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"}); err != nil {
		t.Fatal(err)
	}
	streams, err := tb.db.Streams(ctx)
	if err != nil || len(streams) != 1 {
		t.Fatalf("streams %v, %v: want GONE alone", streams, err)
	}
	if err := tb.db.DeleteConsumer(ctx, streams[0].ID, "C"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, func() error {
		if tb.bridge.cons.Holds("GONE", "C") {
			return errors.New("the consumer deleted elsewhere is still served")
		}
		return nil
	})
}
