package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// TestMain gives the serve tests a PostgreSQL and checks for leaked goroutines.
func TestMain(m *testing.M) { pgtest.Main(m) }

// serveConfig is jetgres's configuration for a test on the database at dbURL, on free ports.
func serveConfig(t *testing.T, dbURL string, args ...string) config {
	t.Helper()
	args = append([]string{"--database-url", dbURL, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--shutdown-timeout", "20s"}, args...)
	cfg, err := parseConfig(args, envMap(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// serveReady runs serve on cfg in the background and returns, once it is ready, the
// addresses it wrote to cfg's --ready-file and the channel serve's result arrives on.
func serveReady(t *testing.T, ctx context.Context, cfg config) (addrs struct{ NATS, HTTP string }, served chan error) {
	t.Helper()
	served = make(chan error, 1)
	go func() { served <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	testwait.For(t, time.Minute, func() error {
		select {
		case err := <-served:
			t.Fatalf("serve ended before it was ready: %v", err)
		default:
		}
		b, err := os.ReadFile(cfg.ReadyFile)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, &addrs)
	})
	return addrs, served
}

// A start that fails after the bridge is up (here the HTTP address is taken) stops everything
// it had started before serve returns.
func TestServeFailureStopsWhatStarted(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := serveConfig(t, dbURL, "--http", taken.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = serve(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "HTTP listener") {
		t.Fatalf("serve with its HTTP address taken: err = %v, want the HTTP listener's error", err)
	}
}

// Without --replica-name, a replica takes its consumer leases as <host>:<NATS port>, the
// default the flag's help and the README give.
func TestServeReplicaNameDefault(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	db := rawsql.Open(t, dbURL)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ready := filepath.Join(t.TempDir(), "ready.json")
	cfg := serveConfig(t, dbURL, "--ready-file", ready)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	addrs, served := serveReady(t, serveCtx, cfg)

	nc, err := nats.Connect(addrs.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"}); err != nil {
		t.Fatal(err)
	}
	var owner string
	if err := db.QueryRow(ctx, `SELECT owner FROM jetgres.consumers WHERE name = 'C'`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(addrs.NATS)
	if err != nil {
		t.Fatal(err)
	}
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if want := net.JoinHostPort(hostname, u.Port()); owner != want {
		t.Errorf("consumer lease owner %q, want %q", owner, want)
	}

	nc.Close()
	stop()
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("serve: %v", err)
	}
}

// Run as root with its data directory under a home that only root may enter, jetgres fails
// with advice that starts with --data-dir, and leaves nothing behind in that home.
func TestDataDirUnderClosedHome(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root runs PostgreSQL as another user")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	home := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	code := run([]string{"--data-dir", filepath.Join(home, "jetgres-data"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}, &out, &errOut)
	if code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, errOut.String())
	}
	msg := errOut.String()
	dataDir, chmod := strings.Index(msg, "--data-dir"), strings.Index(msg, "chmod o+x "+home)
	if dataDir < 0 || chmod < 0 || dataDir > chmod {
		t.Errorf("the advice does not start with --data-dir and then name chmod o+x %s:\n%s", home, msg)
	}
	entries, err := os.ReadDir(home)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("the failed start left %s in %s", e.Name(), home)
	}
}
