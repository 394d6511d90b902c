package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// TestFoundation runs the README's quick start against a jetgres with its private
// PostgreSQL, then stops it the way Ctrl-C would.
func TestFoundation(t *testing.T) {
	t.Parallel()
	j := startJetgres(t, options{})

	t.Run("core NATS through the nats CLI", func(t *testing.T) {
		corePubSub(t, j, "e2e.core.hello", "hello jetgres")
	})

	t.Run("healthz and readyz", func(t *testing.T) {
		if code, body := j.mustGet(t, "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz: %d %q", code, body)
		}
		if code, body := j.mustGet(t, "/readyz"); code != http.StatusOK || strings.TrimSpace(body) != "ready" {
			t.Errorf("/readyz: %d %q", code, body)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		code, body := j.mustGet(t, "/metrics")
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d", code)
		}
		for _, name := range []string{
			"jetgres_build_info",
			"jetgres_append_vegas_limit",
			"jetgres_pop_vegas_limit",
			"jetgres_append_vegas_in_flight",
			"jetgres_pop_vegas_rtt_base_seconds",
			"jetgres_append_permit_wait_seconds_total",
			"jetgres_pg_pool_",
			"jetgres_leaf_",
			"go_goroutines",
			"process_resident_memory_bytes",
		} {
			if !strings.Contains(body, "\n"+name) {
				t.Errorf("/metrics has no %s", name)
			}
		}
	})

	t.Run("ready line names the bound addresses", func(t *testing.T) {
		logs := j.logs.String()
		if !strings.Contains(logs, `msg="jetgres ready"`) || !strings.Contains(logs, "nats="+j.natsURL) || !strings.Contains(logs, "http="+j.httpAddr) {
			t.Errorf("no ready line with nats=%s http=%s in:\n%s", j.natsURL, j.httpAddr, logs)
		}
	})

	// Proves that requireNoPostgres below can see the processes it looks for.
	if len(postgresProcesses(t, j.dataDir)) == 0 {
		t.Fatalf("no postgres process found in %s while jetgres runs", j.dataDir)
	}
	j.stop(t)
	requireNoPostgres(t, j.dataDir)
	if _, err := os.Stat(j.readyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ready file still there after shutdown: %v", err)
	}
	if logs := j.logs.String(); !strings.Contains(logs, `msg="jetgres stopped"`) {
		t.Errorf("no clean stop in logs")
	}
}

// TestRestartAfterSIGKILL kills jetgres without warning, which leaves its PostgreSQL
// running (the server is in a process group of its own), and checks that the next start on
// the same data directory stops that orphan, comes up, and that nothing is left once it stops.
func TestRestartAfterSIGKILL(t *testing.T) {
	t.Parallel()
	dir := newDataDir(t)
	first := startJetgres(t, options{DataDir: dir})
	first.kill(t)
	if len(postgresProcesses(t, dir)) == 0 {
		t.Fatal("no postgres process outlived the SIGKILL: the restart below would find no orphan to stop")
	}

	second := startJetgres(t, options{DataDir: dir})
	if logs := second.logs.String(); !strings.Contains(logs, "stopping a PostgreSQL server left running by an earlier jetgres") {
		t.Errorf("the restart did not say it stopped the orphaned server:\n%s", logs)
	}
	corePubSub(t, second, "e2e.restart", "after SIGKILL")
	second.stop(t)
	requireNoPostgres(t, dir)
}

// TestDatabasePasswordNeverLogged points jetgres at a PostgreSQL that is not there: it must
// fail to start, say why, and never print the password while doing so.
func TestDatabasePasswordNeverLogged(t *testing.T) {
	t.Parallel()
	const password = "Pa55-w0rd-e2e"
	tests := []struct {
		name string
		o    options
	}{
		{"flag URL", options{Args: []string{"--database-url", "postgres://app:" + password + "@127.0.0.1:1/app?connect_timeout=2"}}},
		{"DATABASE_URL keyword DSN", options{Env: []string{"DATABASE_URL=host=127.0.0.1 port=1 user=app password=" + password + " dbname=app connect_timeout=2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := launchJetgres(t, tt.o)
			err := j.wait(stopTimeout)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("jetgres with an unreachable database: %v, want exit code 1", err)
			}
			logs := j.logs.String()
			if strings.Contains(logs, password) {
				t.Errorf("logs contain the database password:\n%s", logs)
			}
			if !strings.Contains(logs, "PostgreSQL") {
				t.Errorf("logs do not say PostgreSQL failed:\n%s", logs)
			}
		})
	}
}

// corePubSub subscribes with `nats sub` and publishes with `nats pub` until the subscriber
// has the message. Publishing more than once covers the moment before the subscription has
// reached the server.
func corePubSub(t *testing.T, j *jetgres, subject, payload string) {
	t.Helper()
	natsCLI(t) // may install it: not within the deadline below
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sub := j.natsCmd(t, ctx, "sub", subject, "--count", "1", "--raw")
	var out syncbuf.Buffer
	sub.Stdout, sub.Stderr = &out, &out
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Wait() }()

	for {
		pub := j.natsCmd(t, ctx, "pub", subject, payload)
		if b, err := pub.CombinedOutput(); err != nil {
			t.Fatalf("nats pub: %v\n%s", err, b)
		}
		select {
		case err := <-subDone:
			if err != nil {
				t.Fatalf("nats sub: %v\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), payload) {
				t.Fatalf("nats sub printed %q, want %q", out.String(), payload)
			}
			return
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("nats sub got nothing: %v\n%s", ctx.Err(), out.String())
		}
	}
}

// postmasterPID reads the private PostgreSQL's pid from its postmaster.pid.
func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	pidFile, err := os.ReadFile(filepath.Join(dataDir, "pg", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(pidFile), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	return pid
}

// TestPrivatePostgresRestartedWhenItDies kills the private PostgreSQL under a running
// jetgres: jetgres restarts it, with crash recovery, and serves again without a restart of
// its own, with what was published before the kill still there.
func TestPrivatePostgresRestartedWhenItDies(t *testing.T) {
	t.Parallel()
	j := startJetgres(t, options{})
	_, js := j.connect(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SURVIVE", Subjects: []string{"survive.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "survive.a", []byte("before")); err != nil {
		t.Fatal(err)
	}
	pid := postmasterPID(t, j.dataDir)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 60*time.Second, func() error {
		if err := privatePostgresRestarted(t, j); err != nil {
			return err
		}
		if code, body := j.mustGet(t, "/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		_, err := js.Publish(ctx, "survive.b", []byte("after"))
		return err
	})
	if now := postmasterPID(t, j.dataDir); now == pid {
		t.Errorf("postmaster pid still %d after the restart", pid)
	}
	stream, err := js.Stream(ctx, "SURVIVE")
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(ctx, 1)
	if err != nil || string(m.Data) != "before" {
		t.Fatalf("message published before the kill: %v, %v", m, err)
	}
	j.stop(t)
	requireNoPostgres(t, j.dataDir)
}

// TestExitsWhenPrivatePostgresCannotComeBack takes the private PostgreSQL's data directory
// away and kills the server: jetgres cannot restart it, so it exits with an error that says
// why, leaving nothing behind.
func TestExitsWhenPrivatePostgresCannotComeBack(t *testing.T) {
	t.Parallel()
	j := startJetgres(t, options{})
	pid := postmasterPID(t, j.dataDir)
	if err := os.Remove(filepath.Join(j.dataDir, "pg", "PG_VERSION")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := j.wait(stopTimeout)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("jetgres after its PostgreSQL could not come back: %v, want exit code 1", err)
	}
	if logs := j.logs.String(); !strings.Contains(logs, "private PostgreSQL cannot come back") {
		t.Errorf("logs do not say why PostgreSQL cannot come back:\n%s", logs)
	}
	requireNoPostgres(t, j.dataDir)
}

// TestSecondJetgresOnSameDataDir starts a second jetgres on a data directory in use: it must
// refuse, without disturbing the first one's PostgreSQL.
func TestSecondJetgresOnSameDataDir(t *testing.T) {
	t.Parallel()
	first := startJetgres(t, options{})
	second := launchJetgres(t, options{DataDir: first.dataDir})
	err := second.wait(stopTimeout)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second jetgres on %s: %v, want exit code 1", first.dataDir, err)
	}
	if logs := second.logs.String(); !strings.Contains(logs, "in use") {
		t.Errorf("second jetgres does not say the data directory is in use:\n%s", logs)
	}
	if code, body := first.mustGet(t, "/readyz"); code != http.StatusOK {
		t.Errorf("first jetgres after the second gave up: /readyz %d %q", code, body)
	}
	first.stop(t)
	requireNoPostgres(t, first.dataDir)
}

// privatePostgresRestarted reports nil once jetgres has counted a restart of its private
// PostgreSQL, and fails t if jetgres exited instead. A backend of a killed postmaster can
// still answer until it notices its parent is gone, so only a counted restart with a new
// postmaster shows jetgres brought it back.
func privatePostgresRestarted(t *testing.T, j *jetgres) error {
	t.Helper()
	if j.hasExited() {
		t.Fatalf("jetgres exited after its PostgreSQL died:\n%s", j.logs.String())
	}
	m, err := j.metrics()
	if err != nil {
		return err
	}
	if n := m["jetgres_private_postgres_restarts_total"]; n < 1 {
		return fmt.Errorf("%v restarts of the private PostgreSQL", n)
	}
	return nil
}
