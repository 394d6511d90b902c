package bridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
)

// A key-value bucket with limit markers on jetgres's injected clock: a key created with a
// TTL expires when the clock passes it, and not before, leaving a marker that reads as a
// purge; the key can be created again; a purge with a TTL goes after it, and so do the
// markers, until the bucket holds only the live key.
func TestKeyValueTTLFakeClock(t *testing.T) {
	t.Parallel()
	clk := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clk }})
	ctx := testContext(t)
	kv, err := tb.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FK", History: 5, LimitMarkerTTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "tok", []byte("a"), jetstream.KeyTTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "user", []byte("ann")); err != nil {
		t.Fatal(err)
	}
	// advance moves the clock by d a second at a time, so that the maintainer's ticker
	// fires at each, and waits until cond holds.
	advance := func(d time.Duration, what string, cond func() error) {
		t.Helper()
		for range int(d / time.Second) {
			clk.Advance(time.Second)
		}
		testwait.For(t, 20*time.Second, func() error {
			if err := cond(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		})
	}
	get := func(key string) error {
		_, err := kv.Get(ctx, key)
		return err
	}
	msgs := func() uint64 {
		s, err := tb.js.Stream(ctx, "KV_FK")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs
	}
	advance(50*time.Second, "before its TTL", func() error { return get("tok") })
	advance(11*time.Second, "after its TTL", func() error {
		if err := get("tok"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("get tok: %v", err)
		}
		return nil
	})
	e, err := kv.History(ctx, "tok")
	if err != nil || len(e) != 1 || e[0].Operation() != jetstream.KeyValuePurge {
		t.Fatalf("history of tok: %v %v", e, err)
	}
	if _, err := kv.Create(ctx, "tok", []byte("c")); err != nil {
		t.Fatalf("create after expiry: %v", err)
	}
	if err := kv.Purge(ctx, "user", jetstream.PurgeTTL(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	advance(11*time.Second, "after the purge's TTL", func() error {
		if n := msgs(); n != 1 {
			return fmt.Errorf("the bucket's stream holds %d messages", n)
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		keys, err := kv.ListKeys(lctx, jetstream.MetaOnly())
		if err != nil {
			return err
		}
		var live []string
		for k := range keys.Keys() {
			live = append(live, k)
		}
		if strings.Join(live, ",") != "tok" {
			return fmt.Errorf("keys %v", live)
		}
		return nil
	})
}
