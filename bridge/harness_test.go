package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testBundle is one running bridge on a fresh database, with a client connected to it.
type testBundle struct {
	db     *pg.DB
	dbURL  string // empty when the test handed setup its database
	nats   *natsd.Server
	link   *leaf.Conn
	bridge *Bridge
	nc     *nats.Conn
	js     jetstream.JetStream
	reg    *prometheus.Registry
}

type setupOpts struct {
	db *pg.DB // reuse a database (restart tests); nil opens a fresh one
	// nats joins the bridge to a NATS server another bundle started, as replicas of one
	// deployment meet on it; nil starts a server of its own.
	nats   *natsd.Server
	config func(*Config)
	// unstarted leaves the bridge built but not started, for tests of Start itself or of a
	// bridge changed before it starts; the cleanup stops it all the same.
	unstarted bool
}

// fakeClockLease is the lease of a bridge on a fake clock whose test does not choose one.
// Such a test jumps its clock by whole ack waits, thresholds and windows at once (an hour,
// at most), while the ownership session is confirmed at the pace of the database: on the
// default lease, whose fencing deadline is two seconds, the bridge would fence itself in
// the gap between a jump and the next confirmation, and stop serving the consumers the test
// is about. A fifth of this lease is longer than any jump those tests make, so only tests
// that set a lease of their own exercise the fence and the lease loop on a fake clock. It
// stays short of nine hours: the lease in seconds is the session's TCP keepalive, which
// Linux takes only up to 32767.
const fakeClockLease = 8 * time.Hour

// setup starts the real pieces: PostgreSQL (one cluster per test process, a database per
// test), the embedded NATS server, the leafnode link and the bridge; and a nats.go client.
func setup(t testing.TB, opts ...setupOpts) *testBundle {
	t.Helper()
	var o setupOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tb := &testBundle{db: o.db, reg: prometheus.NewRegistry()}
	if tb.db == nil {
		tb.dbURL = pgtest.NewDB(t)
		tb.db = pgtest.OpenAt(t, tb.dbURL)
	}
	logger := slog.New(slog.DiscardHandler)
	var err error
	tb.nats = o.nats
	if tb.nats == nil {
		tb.nats, err = natsd.Start(ctx, natsd.Config{Host: "127.0.0.1", Port: -1, Logger: logger})
		if err != nil {
			t.Fatalf("start nats: %v", err)
		}
		t.Cleanup(tb.nats.Stop)
	}
	ep := tb.nats.Leaf()
	// Links that share a server must not share a name.
	tb.link, err = leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Name: fmt.Sprintf("bridge-test-%p", tb), Logger: logger})
	if err != nil {
		t.Fatalf("dial leaf: %v", err)
	}
	t.Cleanup(func() { _ = tb.link.Close() })
	copyLink, err := leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Name: fmt.Sprintf("bridge-test-copy-%p", tb), Logger: logger})
	if err != nil {
		t.Fatalf("dial leaf: %v", err)
	}
	t.Cleanup(func() { _ = copyLink.Close() })
	push, err := flow.NewLane("append", flow.Options{Init: flow.AppendInitDefault, Min: flow.AppendMinDefault, Max: flow.AppendMaxDefault, Alpha: flow.AppendAlphaDefault, Beta: flow.AppendBetaDefault})
	if err != nil {
		t.Fatal(err)
	}
	pop, err := flow.NewLane("pop", flow.Options{Init: flow.PopInitDefault, Min: flow.PopMinDefault, Max: flow.PopMaxDefault, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := flow.NewLane("ack", flow.Options{Init: flow.AckInitDefault, Min: flow.AckMinDefault, Max: flow.AckMaxDefault, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{DB: tb.db, Link: tb.link, CopyLink: copyLink, Append: push, Pop: pop, Ack: ack, Logger: logger, Registerer: tb.reg, ReplicaName: "bridge-test"}
	if o.config != nil {
		o.config(&cfg)
	}
	if _, fake := cfg.Clock.(*clocktest.Fake); fake && cfg.Lease == 0 {
		cfg.Lease = fakeClockLease
	}
	tb.bridge, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !o.unstarted {
		if err := tb.bridge.Start(ctx); err != nil {
			t.Fatalf("start bridge: %v", err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tb.bridge.Stop(ctx); err != nil {
			t.Errorf("stop bridge: %v", err)
		}
	})
	tb.nc, err = nats.Connect(tb.nats.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(tb.nc.Close)
	tb.js, err = jetstream.New(tb.nc)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// stop stops the bridge and its link early, for tests that restart on the same database.
func (tb *testBundle) stop(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.bridge.Stop(ctx); err != nil {
		t.Fatalf("stop bridge: %v", err)
	}
	tb.nc.Close()
	_ = tb.link.Close()
	tb.nats.Stop()
}

// testContext bounds a whole test against a hang, not its speed: 100,000 publishes under the
// race detector on a loaded machine have taken more than a minute.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
