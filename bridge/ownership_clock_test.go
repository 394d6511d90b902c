package bridge

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
)

// ownershipLease is the lease of the tests below: long in real time, so that nothing they
// see comes from a real-time ticker while they run, and a fraction of it is all their fake
// clock moves at a time.
const ownershipLease = time.Hour

// A consumer deleted by another replica stops being served here once PostgreSQL notifies of
// the deletion, on a clock that stands still too: the lease loop, looking at once, knows the
// consumer was activated before its renewal began without asking the clock, which would
// give both the same time.
func TestLeaseLoopStopsAConsumerDeletedElsewhereOnAStillClock(t *testing.T) {
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
		if tb.bridge.cons.own.holds("GONE", "C") {
			return errors.New("the consumer deleted elsewhere is still served")
		}
		return nil
	})
}
