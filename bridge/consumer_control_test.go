package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// A consumer whose event queue is full of acks still takes a purge: losing it would leave
// the consumer's floor and delivered sequence where the purge no longer lets them be.
func TestPurgeReachesAConsumerWithAFullQueue(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "FULLQ", "fullq.>")
	publishN(t, ctx, tb.js, "fullq.a", 10)
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	c := tb.bridge.cons.Inspect("FULLQ", "C")
	if c == nil {
		t.Fatal("consumer not served")
	}
	// Hold the goroutine and fill its queue with acks it will ignore.
	c.Lock()
	c.FillQueue()
	purged := s.Purge(ctx)
	c.Unlock()
	if purged != nil {
		t.Fatal(purged)
	}
	testwait.For(t, 5*time.Second, func() error {
		info, err := s.Consumer(ctx, "C")
		if err != nil {
			return err
		}
		if ci := info.CachedInfo(); ci.AckFloor.Stream != 10 || ci.NumPending != 0 {
			return fmt.Errorf("ack floor %d, %d pending; want 10 and 0", ci.AckFloor.Stream, ci.NumPending)
		}
		return nil
	})
}
