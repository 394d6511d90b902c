package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jetgres/jetgres/internal/testwait"
)

// privateNode runs serve in-process on a private PostgreSQL and returns its addresses, its
// data directory, and the channel serve's result arrives on.
func privateNode(t *testing.T, ctx context.Context) (addrs struct{ NATS, HTTP string }, dataDir string, served chan error) {
	t.Helper()
	dir := t.TempDir()
	// As root the server runs as another user, which must be able to pass the test's directory.
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "ready.json")
	cfg, err := parseConfig([]string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--ready-file", ready, "--shutdown-timeout", "20s"}, envMap(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	addrs, served = serveReady(t, ctx, cfg)
	return addrs, filepath.Join(cfg.DataDir, "pg"), served
}

func postmasterPID(t *testing.T, pgDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pgDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func kill(t *testing.T, pid int) {
	t.Helper()
	// A server whose data directory was removed may notice by itself and exit first.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatal(err)
	}
}

// The private PostgreSQL is killed with SIGKILL under a publish load whose publishers retry
// with the same Nats-Msg-Id until acknowledged: jetgres stays up, /readyz answers 503 and then
// 200 again, the server is restarted without a restart of jetgres, and every acknowledged
// publish is stored, once.
func TestPrivatePostgresKilledUnderLoad(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	addrs, pgDir, served := privateNode(t, serveCtx)
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	nc, err := nats.Connect(addrs.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K", Subjects: []string{"k.>"}})
	if err != nil {
		t.Fatal(err)
	}

	// /readyz is sampled all along, so that the 503 of a quick restart is not missed.
	var (
		mu       sync.Mutex
		statuses []int
	)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for sampleCtx.Err() == nil {
			if resp, err := http.Get("http://" + addrs.HTTP + "/readyz"); err == nil {
				resp.Body.Close()
				mu.Lock()
				if n := len(statuses); n == 0 || statuses[n-1] != resp.StatusCode {
					statuses = append(statuses, resp.StatusCode)
				}
				mu.Unlock()
			}
			select {
			case <-tick.C:
			case <-sampleCtx.Done():
			}
		}
	}()

	const publishers = 4
	type acked struct {
		id  string
		seq uint64
	}
	var (
		ackMu   sync.Mutex
		acks    []acked
		retries int
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				id := fmt.Sprintf("p%d-%d", p, i)
				for loadCtx.Err() == nil {
					pctx, cancel := context.WithTimeout(loadCtx, 2*time.Second)
					ack, err := js.Publish(pctx, "k.x", []byte(id), jetstream.WithMsgID(id))
					cancel()
					if err == nil {
						ackMu.Lock()
						acks = append(acks, acked{id, ack.Sequence})
						ackMu.Unlock()
						break
					}
					ackMu.Lock()
					retries++
					ackMu.Unlock()
					// Paces the retries of a publish answered 503 at once.
					select {
					case <-time.After(20 * time.Millisecond):
					case <-loadCtx.Done():
					}
				}
			}
		})
	}
	ackedCount := func() int {
		ackMu.Lock()
		defer ackMu.Unlock()
		return len(acks)
	}
	testwait.For(t, time.Minute, func() error {
		if n := ackedCount(); n < 200 {
			return fmt.Errorf("%d publishes acknowledged before the kill, want 200", n)
		}
		return nil
	})

	killed := postmasterPID(t, pgDir)
	kill(t, killed)
	t.Logf("killed postmaster %d after %d acknowledged publishes", killed, ackedCount())
	before := ackedCount()
	testwait.For(t, time.Minute, func() error {
		if metric(t, addrs.HTTP, "jetgres_private_postgres_restarts_total") != 1 || metric(t, addrs.HTTP, "jetgres_private_postgres_up") != 1 {
			return errors.New("the private PostgreSQL is not back yet")
		}
		if n := ackedCount(); n < before+200 {
			return fmt.Errorf("%d publishes acknowledged since the kill, want 200", n-before)
		}
		return nil
	})
	stopLoad()
	wg.Wait()
	stopSampling()
	<-sampled
	select {
	case err := <-served:
		t.Fatalf("jetgres exited: %v", err)
	default:
	}

	mu.Lock()
	t.Logf("/readyz went %v; %d publishes retried", statuses, retries)
	// A loaded machine can make a ping miss its second while PostgreSQL runs, or a
	// transaction of the backlog outlast --ready-stall once it is back: /readyz may flap
	// around the outage, but it must start ready, report the outage and end ready.
	if n := len(statuses); n < 3 || statuses[0] != http.StatusOK || statuses[n-1] != http.StatusOK ||
		!slices.Contains(statuses, http.StatusServiceUnavailable) {
		t.Errorf("/readyz went %v, want 200, then 503 while PostgreSQL was away, then 200", statuses)
	}
	mu.Unlock()

	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]uint64{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("sequence %d: %v", seq, err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if first, ok := stored[id]; ok {
			t.Fatalf("%s stored twice, at sequences %d and %d", id, first, seq)
		}
		stored[id] = seq
	}
	for _, a := range acks {
		if seq, ok := stored[a.id]; !ok || seq != a.seq {
			t.Fatalf("%s was acknowledged at sequence %d, but is stored at %d (found: %v)", a.id, a.seq, seq, ok)
		}
	}
	// A publish that the end of the load cancelled may have been stored unacknowledged: at
	// most one per publisher.
	if extra := len(stored) - len(acks); extra < 0 || extra > publishers {
		t.Errorf("stream holds %d messages for %d acknowledged publishes", len(stored), len(acks))
	}
}

// metric reads one unlabelled sample from /metrics; -1 when it is missing.
func metric(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// When the private PostgreSQL dies and its data directory is gone, it cannot come back:
// jetgres exits with one error that says so.
func TestPrivatePostgresCannotComeBack(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, pgDir, served := privateNode(t, ctx)
	pid := postmasterPID(t, pgDir)
	if err := os.RemoveAll(pgDir); err != nil {
		t.Fatal(err)
	}
	kill(t, pid)
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		t.Fatal("jetgres still runs a minute after its private PostgreSQL died without a data directory")
	}
	want := "private PostgreSQL cannot come back: its data directory " + pgDir + " is gone"
	if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Count(err.Error(), "\n") > 0 {
		t.Fatalf("serve: %v, want one line starting %q", err, want)
	}
}
