package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorCatchUpBench measures, in one run, how long a new mirror takes to catch up
// with a stream of JETGRES_MIRROR_MSGS messages (1,000,000 unless set; the fill of the
// backup benchmark): JetStream mirroring its own stream, jetgres mirroring its own, and
// jetgres mirroring JetStream's (a hub in domain "hub") over a leafnode remote. It runs
// only with JETGRES_MIRROR_BENCH=1:
//
//	JETGRES_MIRROR_BENCH=1 go test -run TestMirrorCatchUpBench -v -timeout 60m ./e2e/
func TestMirrorCatchUpBench(t *testing.T) {
	if os.Getenv("JETGRES_MIRROR_BENCH") != "1" {
		t.Skip("set JETGRES_MIRROR_BENCH=1 to run")
	}
	n := 1_000_000
	if v := os.Getenv("JETGRES_MIRROR_MSGS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("JETGRES_MIRROR_MSGS=%q: a positive number of messages, please", v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	catchUp := func(what string, js jetstream.JetStream, mirror *jetstream.StreamSource) time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Mirror: mirror}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 50*time.Minute, func() error {
			s, err := js.Stream(ctx, "M")
			if err != nil {
				return err
			}
			if st := s.CachedInfo().State; st.LastSeq != uint64(n) || st.Msgs != uint64(n) {
				return fmt.Errorf("%s: mirror at %d with %d messages", what, st.LastSeq, st.Msgs)
			}
			return nil
		})
		d := time.Since(start)
		t.Logf("%s: %d messages in %v, %.0f msg/s", what, n, d.Round(time.Millisecond), float64(n)/d.Seconds())
		return d
	}
	origin := jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}

	js := jsAt(t, startJetStream(t).url)
	if _, err := js.CreateStream(ctx, origin); err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, js, n)
	ref := catchUp("JetStream -> JetStream", js, &jetstream.StreamSource{Name: "ORDERS"})

	j := startWithDatabase(t, testDatabase(t))
	_, pgJS := j.connect(t)
	if _, err := pgJS.CreateStream(ctx, origin); err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, pgJS, n)
	// The read floor: an ordered consumer, the kind of push consumer a mirror creates,
	// reading the whole origin.
	start := time.Now()
	read := readOrdered(t, ctx, pgJS, "ORDERS", n)
	t.Logf("read floor, an ordered consumer reading jetgres's ORDERS: %d messages in %v, %.0f msg/s",
		read, time.Since(start).Round(time.Millisecond), float64(read)/time.Since(start).Seconds())
	ours := catchUp("jetgres -> jetgres", pgJS, &jetstream.StreamSource{Name: "ORDERS"})

	hub := startDomainHub(t)
	conf := filepath.Join(t.TempDir(), "leaf.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "leafnodes { remotes: [ { url: %q } ] }\n", hub.leafURL(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	hubNC, err := nats.Connect(hub.ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer hubNC.Close()
	hubJS, err := jetstream.New(hubNC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubJS.CreateStream(ctx, origin); err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, hubJS, n)
	leafJ := startJetgres(t, options{Args: []string{"--nats-config", conf, "--js-domain", "pg"}})
	testwait.For(t, 30*time.Second, func() error { _, err := hub.leaf(); return err })
	_, leafJS := leafJ.connect(t)
	ext := catchUp("JetStream -> jetgres (leafnode)", leafJS, &jetstream.StreamSource{Name: "ORDERS",
		External: &jetstream.ExternalStream{APIPrefix: "$JS.hub.API"}})
	t.Logf("against JetStream mirroring itself: jetgres -> jetgres %.2fx, JetStream -> jetgres %.2fx",
		ref.Seconds()/ours.Seconds(), ref.Seconds()/ext.Seconds())
}

// readOrdered reads n messages of stream with an ordered consumer and returns how many it read.
func readOrdered(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string, n int) int {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	done := make(chan struct{})
	cc, err := cons.Consume(func(jetstream.Msg) {
		if got++; got == n {
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("read %d of %d messages of %s", got, n, stream)
	}
	return got
}
