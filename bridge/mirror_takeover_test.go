package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorTakeover runs two replicas: exactly one copies into the mirror, the other
// reports in stream info what that one knows, and once it stops the other takes the
// stream's copy lock and goes on from what the mirror holds.
func TestMirrorTakeover(t *testing.T) {
	ctx := testContext(t)
	a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
	b := setup(t, setupOpts{db: a.db, nats: a.nats, config: func(c *Config) { c.ReplicaName = "b" }})
	if _, err := a.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}}); err != nil {
		t.Fatal(err)
	}
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := b.js.Publish(ctx, "orders.x", fmt.Appendf(nil, "%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitLast := func(last uint64) {
		testwait.For(t, 30*time.Second, func() error {
			s, err := b.js.Stream(ctx, "M")
			if err != nil {
				return err
			}
			if st := s.CachedInfo().State; st.LastSeq != last || st.Msgs != last {
				return fmt.Errorf("mirror at %d with %d messages, want %d", st.LastSeq, st.Msgs, last)
			}
			return nil
		})
	}
	publish(0, 20)
	waitLast(20)
	id := a.bridge.streams.Lookup("M").ID()
	var copier, other *testBundle
	testwait.For(t, 10*time.Second, func() error {
		switch ca, cb := a.bridge.copies.Copying(id), b.bridge.copies.Copying(id); {
		case ca && cb:
			return fmt.Errorf("both replicas copy")
		case ca:
			copier, other = a, b
		case cb:
			copier, other = b, a
		default:
			return fmt.Errorf("no replica copies")
		}
		return nil
	})
	// The replica that does not copy reports what the one that copies knows.
	testwait.For(t, 10*time.Second, func() error {
		mi, _ := other.bridge.copies.Info(other.bridge.streams.Lookup("M"))
		if mi == nil || mi.Active < 0 || mi.Lag != 0 || mi.Name != "ORDERS" {
			return fmt.Errorf("mirror info on the replica that does not copy: %+v", mi)
		}
		return nil
	})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := copier.bridge.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if !other.bridge.copies.Copying(id) {
			return fmt.Errorf("the other replica does not copy yet")
		}
		return nil
	})
	b = other
	publish(20, 40)
	waitLast(40)
}
