package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// While another session holds a stream's state row, its publish transaction cannot commit
// although PostgreSQL answers pings: /readyz turns 503 once that transaction is older than
// --ready-stall, and back to 200 once it commits. The publish held meanwhile is acknowledged.
func TestReadyzStallsWithAHungCommit(t *testing.T) {
	dbURL := pgtest.NewDB(t)
	db := rawsql.Open(t, dbURL)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const stall = 300 * time.Millisecond
	ready := filepath.Join(t.TempDir(), "ready.json")
	cfg := serveConfig(t, dbURL, "--ready-file", ready, "--ready-stall", stall.String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	addrs, served := serveReady(t, serveCtx, cfg)
	defer func() {
		stop()
		if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	}()

	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addrs.HTTP + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the stall: %d %q, want 200", code, body)
	}

	nc, err := nats.Connect(addrs.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := db.QueryRow(ctx, `SELECT id FROM jetgres.streams WHERE name = 'S'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	release := db.HoldRows(t, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, id)
	defer release() // before serve stops, which waits for the held commit

	// Taken before the publish is sent: its transaction may begin before PublishAsync returns.
	locked := time.Now()
	acked, err := js.PublishAsync("s.x", []byte("held"), jetstream.WithMsgID("held-1"))
	if err != nil {
		t.Fatal(err)
	}
	// The stall shows after the threshold, not at once, and long before the statement
	// timeout (cfg.StmtTimeout, 30 s) would end the transaction: half of it tells readiness
	// from a failed publish however loaded the machine.
	within := cfg.StmtTimeout / 2
	testwait.For(t, within, func() error {
		code, body := readyz()
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "publish transaction") {
			return fmt.Errorf("/readyz while the commit hangs: %d %q, want 503 naming the publish transaction", code, body)
		}
		return nil
	})
	if took := time.Since(locked); took < stall {
		t.Errorf("/readyz turned 503 %s after the publish, want soon after --ready-stall %s", took, stall)
	}
	select {
	case <-acked.Ok():
		t.Fatal("the publish was acknowledged while its stream's state row was locked")
	case err := <-acked.Err():
		t.Fatalf("the publish failed while held: %v", err)
	default:
	}

	release()
	testwait.For(t, within, func() error {
		if code, body := readyz(); code != http.StatusOK {
			return fmt.Errorf("/readyz after the lock was released: %d %q, want 200", code, body)
		}
		return nil
	})
	select {
	case ack := <-acked.Ok():
		if ack.Sequence != 1 {
			t.Errorf("the held publish was acknowledged with sequence %d, want 1", ack.Sequence)
		}
	case err := <-acked.Err():
		t.Fatalf("the held publish failed: %v", err)
	case <-ctx.Done():
		t.Fatal("the held publish was never acknowledged")
	}
}
