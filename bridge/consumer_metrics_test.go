package bridge

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/consumer"
	"github.com/jetgres/jetgres/internal/testwait"
)

// A scrape that waits for a busy consumer holds no lock of the consumer registry meanwhile:
// a consumer being created, and the acks behind it on the link's read loop, go on.
func TestScrapeWaitsForAConsumerWithoutTheRegistryLock(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{})
	ctx := context.Background()
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	cs := tb.bridge.cons
	var c *consumer.Inspector
	testwait.For(t, 10*time.Second, func() error {
		if c = cs.Inspect("S", "C"); c == nil {
			return errors.New("consumer C is not served yet")
		}
		return nil
	})

	// The consumer busy, as in a long delivery batch, while a scrape comes.
	c.Lock()
	busy := true
	t.Cleanup(func() {
		if busy {
			c.Unlock()
		}
	})
	scraped := make(chan error, 1)
	go func() {
		_, err := tb.reg.Gather()
		scraped <- err
	}()
	testwait.For(t, 10*time.Second, func() error {
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "consumer.(*Engine).gauges") && strings.Contains(g, "[sync.Mutex.Lock") {
				return nil
			}
		}
		return errors.New("the scrape is not waiting for the busy consumer yet")
	})
	testwait.For(t, 10*time.Second, func() error {
		if cs.RegistryBusy() {
			return errors.New("the consumer registry stays locked while the scrape waits for a busy consumer")
		}
		return nil
	})
	busy = false
	c.Unlock()
	if err := <-scraped; err != nil {
		t.Fatal(err)
	}
}
