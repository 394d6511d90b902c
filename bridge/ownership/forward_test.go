package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// replica is one Forwarder started on a link of its own to a shared NATS server and a
// connection pool of its own to a shared database, as a replica of a deployment has, with
// what it logs and the requests forwarded to it that it took.
type replica struct {
	fwd   *Forwarder
	clock *clocktest.Fake
	reg   *prometheus.Registry
	log   *syncbuf.Buffer
	taken chan *leaf.Msg
}

// startReplicas starts one Forwarder per clock, named "a", "b" and so on, on one NATS
// server and one database.
func startReplicas(t *testing.T, clocks ...*clocktest.Fake) []*replica {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	discard := slog.New(slog.DiscardHandler)
	srv, err := natsd.Start(ctx, natsd.Config{Host: "127.0.0.1", Port: -1, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	url := pgtest.NewDB(t)
	var reps []*replica
	for i, clk := range clocks {
		name := string(rune('a' + i))
		ep := srv.Leaf()
		link, err := leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Name: "replica-" + name, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = link.Close() })
		r := &replica{clock: clk, reg: prometheus.NewRegistry(), log: &syncbuf.Buffer{}, taken: make(chan *leaf.Msg, 16)}
		r.fwd = NewForwarder(ForwarderConfig{Store: pgtest.OpenAt(t, url), Link: link, Clock: clk, ReplicaName: name,
			Logger: slog.New(slog.NewTextHandler(r.log, nil)), Registerer: r.reg})
		err = r.fwd.Start(ctx, func(m *leaf.Msg) {
			if _, ok := r.fwd.Received(m); ok {
				r.taken <- m
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.fwd.Stop)
		reps = append(reps, r)
	}
	return reps
}

// A request on this replica's forwarding subjects is taken only with a fresh seal made with
// the deployment's secret over what the replica acts on; anything else is refused.
func TestReceivedChecksTheSeal(t *testing.T) {
	t.Parallel()
	f := startReplicas(t, clocktest.New())[0].fwd
	const api = "CONSUMER.DELETE.S.C"
	sealed := func(at time.Time, m *leaf.Msg) *leaf.Msg {
		m.Subject = f.Prefix("a") + f.Seal(at.Unix(), api, m) + "." + api
		return m
	}

	if forwarded, ok := f.Received(&leaf.Msg{Subject: "$JS.API." + api}); forwarded || !ok {
		t.Fatalf("a request sent to $JS.API: forwarded %v, ok %v; want false, true", forwarded, ok)
	}
	m := sealed(f.now(), &leaf.Msg{Reply: "_INBOX.1", Data: []byte("{}")})
	if forwarded, ok := f.Received(m); !forwarded || !ok || m.Subject != "$JS.API."+api {
		t.Fatalf("a sealed request: forwarded %v, ok %v, subject %q; want it taken as $JS.API.%s", forwarded, ok, m.Subject, api)
	}

	refused := map[string]*leaf.Msg{
		"stale":           sealed(f.now().Add(-2*ForwardMaxAge), &leaf.Msg{Reply: "_INBOX.2"}),
		"from the future": sealed(f.now().Add(2*ForwardMaxAge), &leaf.Msg{Reply: "_INBOX.3"}),
		"unsealed":        {Subject: f.Prefix("a") + api},
		"another reply": func() *leaf.Msg {
			m := sealed(f.now(), &leaf.Msg{Reply: "_INBOX.4"})
			m.Reply = "_INBOX.5"
			return m
		}(),
		"another body": func() *leaf.Msg {
			m := sealed(f.now(), &leaf.Msg{Data: []byte("a")})
			m.Data = []byte("b")
			return m
		}(),
		"another sender": func() *leaf.Msg {
			m := sealed(f.now(), &leaf.Msg{})
			m.Subject = strings.Replace(m.Subject, f.own+"61.", f.own+"62.", 1)
			return m
		}(),
	}
	for what, m := range refused {
		if forwarded, ok := f.Received(m); !forwarded || ok {
			t.Errorf("%s request: forwarded %v, ok %v; want true, false", what, forwarded, ok)
		}
	}

	other := NewForwarder(ForwarderConfig{Store: f.cfg.Store, Clock: f.cfg.Clock, ReplicaName: "a"})
	other.key = []byte("another deployment's secret")
	if _, ok := other.Received(sealed(f.now(), &leaf.Msg{})); ok {
		t.Error("a request sealed with another secret was taken")
	}
}

// Two replicas whose clocks are five minutes apart forward to each other: each seals and
// checks seals on PostgreSQL's clock as it measured it. A request sealed on a replica's own
// clock, as all were before, is refused, and loudly: the refusing replica logs and counts
// it, naming the sender, and the sender, told, logs and counts it too.
func TestForwardAcrossSkewedClocks(t *testing.T) {
	t.Parallel()
	const skew = 5 * time.Minute
	reps := startReplicas(t, clocktest.New(), clocktest.At(time.Now().Add(skew)))
	a, b := reps[0], reps[1]
	for _, r := range reps {
		if off, ok := r.fwd.cfg.Store.(interface{ ClockOffset() (time.Duration, bool) }).ClockOffset(); !ok {
			t.Fatalf("replica %s has not measured its clock", r.fwd.cfg.ReplicaName)
		} else {
			t.Logf("replica %s: PostgreSQL's clock ahead of its own by %v", r.fwd.cfg.ReplicaName, off)
		}
	}
	if d := b.fwd.now().Sub(a.fwd.now()); d > 10*time.Second || d < -10*time.Second {
		t.Fatalf("the replicas' times on PostgreSQL's clock are %v apart", d)
	}

	// b forwards a request for a consumer that a serves, as the API does.
	req := &leaf.Msg{Subject: "$JS.API.CONSUMER.INFO.S.C", Reply: "_INBOX.skew", Data: []byte("{}")}
	testwait.For(t, 10*time.Second, func() error {
		if err := b.fwd.Forward(req, &ServedBy{Owner: "a"}, false); !errors.Is(err, ErrForwarded) {
			return fmt.Errorf("forward: %v", err)
		}
		return nil
	})
	select {
	case m := <-a.taken:
		if m.Subject != req.Subject || m.Reply != req.Reply {
			t.Fatalf("a took %s reply %s, want %s reply %s", m.Subject, m.Reply, req.Subject, req.Reply)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a took nothing; refused: %v", testutil.ToFloat64(a.fwd.refused.WithLabelValues(RefusedClock, "b")))
	}

	// Sealed on b's own clock, five minutes ahead. Its client is answered with the refusal.
	api := "CONSUMER.INFO.S.C"
	local := &leaf.Msg{Reply: "_INBOX.local"}
	answers := make(chan *leaf.Msg, 1)
	sub, err := b.fwd.cfg.Link.Subscribe(local.Reply, "", func(m *leaf.Msg) { answers <- m })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.fwd.cfg.Link.Publish(a.fwd.Prefix("a")+b.fwd.Seal(b.clock.Now().Unix(), api, local)+"."+api, local.Reply, nil, nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := testutil.ToFloat64(a.fwd.refused.WithLabelValues(RefusedClock, "b")); n != 1 {
			return fmt.Errorf("a counted %v refusals of b's requests for their time", n)
		}
		if n := testutil.ToFloat64(b.fwd.refusedThere.WithLabelValues("a")); n != 1 {
			return fmt.Errorf("b counted %v refusals by a", n)
		}
		// Each side counts before it logs: wait for the lines too.
		for _, want := range []struct {
			r           *replica
			line, other string
		}{
			{a, "refused a consumer request another replica forwarded", "replica=b"},
			{b, "another replica refused a consumer request this replica forwarded", "replica=a"},
		} {
			if log := want.r.log.String(); !strings.Contains(log, want.line) || !strings.Contains(log, want.other) {
				return fmt.Errorf("replica %s logged %q; want %q with %s", want.r.fwd.cfg.ReplicaName, log, want.line, want.other)
			}
		}
		return nil
	})
	for _, want := range []struct {
		r    *replica
		name string
	}{{a, "jetgres_consumer_forwards_refused_total"}, {b, "jetgres_consumer_forwards_refused_elsewhere_total"}} {
		if !gathered(t, want.r.reg, want.name) {
			t.Errorf("replica %s's /metrics has no %s", want.r.fwd.cfg.ReplicaName, want.name)
		}
	}
	select {
	case m := <-answers:
		if !strings.Contains(string(m.Data), ErrForwardRefused.Error()) || !strings.Contains(string(m.Data), "consumer_info_response") {
			t.Errorf("the client was answered %s; want the refusal, as consumer info", m.Data)
		}
	case <-time.After(10 * time.Second):
		t.Error("the client of the refused request got no answer")
	}
	select {
	case m := <-a.taken:
		t.Fatalf("a took %s, sealed on a clock five minutes off", m.Subject)
	default:
	}
}

// gathered reports whether reg shows the series called name.
func gathered(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return true
		}
	}
	return false
}
