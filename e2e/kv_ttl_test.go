package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestKeyValueTTLs runs a key-value bucket with limit markers through nats.go's jetstream
// package against a real JetStream and against jetgres, and compares what a watcher saw:
// a key created with a TTL expires and leaves a marker that reads as a purge, the key can
// be created again, a purge with a TTL goes with it, and the markers go after their own TTL.
func TestKeyValueTTLs(t *testing.T) {
	t.Parallel()
	var seen [2]string
	for i, s := range []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}} {
		seen[i] = kvTTLScenario(t, s)
	}
	if seen[0] != seen[1] {
		t.Errorf("the watchers saw different things:\n--- jetstream\n%s\n--- jetgres\n%s", seen[0], seen[1])
	}
}

// kvTTLScenario is TestKeyValueTTLs on one server; it returns what the watcher saw.
func kvTTLScenario(t *testing.T, s natsServer) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, err := jetstream.New(connectURL(t, s.url))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "SESS", History: 5, LimitMarkerTTL: 2 * time.Second})
	if err != nil {
		t.Fatalf("%s: create bucket: %v", s.name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil || st.LimitMarkerTTL() != 2*time.Second {
		t.Fatalf("%s: bucket status: limit marker TTL %v, %v", s.name, st.LimitMarkerTTL(), err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var seen []string
	// next waits for the watcher's next entry: the ones these steps make arrive in order.
	next := func(want string) {
		t.Helper()
		for {
			select {
			case e := <-w.Updates():
				if e == nil {
					continue // the end of the initial values
				}
				got := fmt.Sprintf("%s %s=%q rev %d", e.Operation(), e.Key(), e.Value(), e.Revision())
				seen = append(seen, got)
				if strings.HasPrefix(got, want) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("%s: the watcher saw %q, not %q", s.name, seen, want)
			}
		}
	}
	gone := func(key string) {
		t.Helper()
		testwait.For(t, 20*time.Second, func() error {
			_, err := kv.Get(ctx, key)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil
			}
			return fmt.Errorf("%s: get %s: %v", s.name, key, err)
		})
	}

	if _, err := kv.Create(ctx, "tok", []byte("a"), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatalf("%s: create with a TTL: %v", s.name, err)
	}
	next("KeyValuePutOp tok")
	if _, err := kv.Put(ctx, "user", []byte("ann")); err != nil {
		t.Fatal(err)
	}
	next("KeyValuePutOp user")
	if _, err := kv.Create(ctx, "tok", []byte("b")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("%s: create of a live key: %v", s.name, err)
	}
	gone("tok")
	next("KeyValuePurgeOp tok")
	if _, err := kv.Create(ctx, "tok", []byte("c")); err != nil {
		t.Fatalf("%s: create after expiry: %v", s.name, err)
	}
	next("KeyValuePutOp tok")
	if err := kv.Purge(ctx, "user", jetstream.PurgeTTL(2*time.Second)); err != nil {
		t.Fatalf("%s: purge with a TTL: %v", s.name, err)
	}
	next("KeyValuePurgeOp user")
	gone("user")
	// The purge and its marker go after their TTLs, and with them every trace of the key.
	testwait.For(t, 20*time.Second, func() error {
		si, err := js.Stream(ctx, "KV_SESS")
		if err != nil {
			return err
		}
		if n := si.CachedInfo().State.Msgs; n != 1 {
			return fmt.Errorf("%s: the bucket's stream holds %d messages", s.name, n)
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		keys, err := kv.ListKeys(lctx, jetstream.MetaOnly())
		if err != nil {
			return fmt.Errorf("%s: list keys: %w", s.name, err)
		}
		var live []string
		for k := range keys.Keys() {
			live = append(live, k)
		}
		if strings.Join(live, ",") != "tok" {
			return fmt.Errorf("%s: keys %v", s.name, live)
		}
		return nil
	})
	return strings.Join(seen, "\n")
}

// TestKeyValueTTLCLI: `nats kv add --marker-ttl`, `nats kv create --ttl` and
// `nats kv purge --ttl` against a real JetStream and jetgres: the bucket reports its
// marker TTL, the key expires, and the purge marker goes after its TTL.
func TestKeyValueTTLCLI(t *testing.T) {
	t.Parallel()
	var info [2]string
	for i, s := range []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}} {
		natsAt(t, s, "kv", "add", "CLIT", "--marker-ttl", "2s", "--history", "3")
		natsAt(t, s, "kv", "create", "CLIT", "k", "v1", "--ttl", "1s")
		natsAt(t, s, "kv", "put", "CLIT", "p", "v2")
		natsAt(t, s, "kv", "purge", "CLIT", "p", "--ttl", "2s", "-f")
		if out := natsAt(t, s, "kv", "get", "CLIT", "k", "--raw"); strings.TrimSpace(out) != "v1" {
			t.Fatalf("%s: kv get before expiry printed %q", s.name, out)
		}
		testwait.For(t, 20*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
			defer cancel()
			out, err := natsCmdAt(t, ctx, s.url, "kv", "get", "CLIT", "k", "--raw").CombinedOutput()
			if err == nil {
				return fmt.Errorf("%s: kv get still prints %q", s.name, out)
			}
			return nil
		})
		testwait.For(t, 20*time.Second, func() error {
			out := natsAt(t, s, "stream", "info", "KV_CLIT", "--json")
			if !strings.Contains(out, `"messages": 0`) {
				return fmt.Errorf("%s: the bucket still holds messages: %s", s.name, out)
			}
			return nil
		})
		info[i] = natsAt(t, s, "kv", "info", "CLIT")
	}
	for _, want := range []string{"Per-Key TTL Supported: true", "Limit Marker TTL: 2s"} {
		for i, name := range []string{"jetstream", "jetgres"} {
			if !strings.Contains(info[i], want) {
				t.Errorf("%s: kv info does not say %q:\n%s", name, want, info[i])
			}
		}
	}
}
