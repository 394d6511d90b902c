package bridge

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	cs := tb.bridge.cs()
	var c *consumer
	testwait.For(t, 10*time.Second, func() error {
		cs.mu.RLock()
		if sc := cs.streams[tb.bridge.streams.Lookup("S")]; sc != nil {
			c = sc.get("C")
		}
		cs.mu.RUnlock()
		if c == nil {
			return errors.New("consumer C is not served yet")
		}
		return nil
	})

	// The consumer busy, as in a long delivery batch, while a scrape comes.
	c.mu.Lock()
	busy := true
	t.Cleanup(func() {
		if busy {
			c.mu.Unlock()
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
			if strings.Contains(g, "(*consumerMetrics).Collect") && strings.Contains(g, "[sync.Mutex.Lock") {
				return nil
			}
		}
		return errors.New("the scrape is not waiting for the busy consumer yet")
	})
	testwait.For(t, 10*time.Second, func() error {
		if !cs.mu.TryLock() {
			return errors.New("the consumer registry stays locked while the scrape waits for a busy consumer")
		}
		cs.mu.Unlock()
		return nil
	})
	busy = false
	c.mu.Unlock()
	if err := <-scraped; err != nil {
		t.Fatal(err)
	}
}
