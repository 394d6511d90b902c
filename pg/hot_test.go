package pg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// openDB opens a pool on a fresh database with cfg's timeouts and size.
func openDB(t *testing.T, cfg pg.Config) *pg.DB {
	t.Helper()
	cfg.URL = pgtest.NewDB(t)
	db, err := pg.Open(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db
}

func backendPID(t *testing.T, db *pg.DB) int32 {
	t.Helper()
	var pid int32
	if _, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		return q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	}); err != nil {
		t.Fatal(err)
	}
	return pid
}

func count(t *testing.T, db *pg.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Background(t.Context(), func(ctx context.Context, q pg.Querier) error {
		return q.QueryRow(ctx, sql, args...).Scan(&n)
	}); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestHotTimeoutCancelsOnServer(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	db := openDB(t, pg.Config{StmtTimeout: timeout, MaxConns: 8})
	observer := openDB(t, pg.Config{MaxConns: 2})
	backendPID(t, db) // one idle connection, which the timed call reuses
	before := db.Stats()

	var pid int32
	start := time.Now()
	rtt, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		if err := q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `SELECT pg_sleep(10)`)
		return err
	})
	elapsed := time.Since(start)
	t.Logf("rtt %v, call %v, err %v", rtt, elapsed, err)

	if !errors.Is(err, pg.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if rtt < timeout {
		t.Errorf("rtt = %v, want at least the timeout %v", rtt, timeout)
	}
	// How soon after the timeout the call returns depends on the machine's load; what must
	// not happen is a wait for the statement to end by itself (the ten seconds of pg_sleep).
	if elapsed > 5*time.Second {
		t.Errorf("call took %v, want about %v: it waited for the statement", elapsed, timeout)
	}
	// The cancel was answered before Hot returned: the backend is no longer running pg_sleep.
	if n := count(t, observer, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'`, pid); n != 0 {
		t.Errorf("backend %d still active right after the timeout", pid)
	}
	testwait.For(t, 30*time.Second, func() error {
		if count(t, observer, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) != 0 {
			return fmt.Errorf("timed-out backend %d still runs", pid)
		}
		return nil
	})
	if n := count(t, observer, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(10)%' AND state = 'active'`); n != 0 {
		t.Errorf("%d backends still run pg_sleep(10)", n)
	}

	s := db.Stats()
	if s.Timeouts != before.Timeouts+1 || s.Destroyed != before.Destroyed+1 {
		t.Errorf("Stats timeouts %d→%d destroyed %d→%d, want one more of each", before.Timeouts, s.Timeouts, before.Destroyed, s.Destroyed)
	}
	if s.Total != before.Total-1 {
		t.Errorf("pool total %d→%d, want the timed-out connection gone", before.Total, s.Total)
	}

	var wg sync.WaitGroup
	pids := make(chan int32, 32)
	for range 32 {
		wg.Go(func() { pids <- backendPID(t, db) })
	}
	wg.Wait()
	close(pids)
	for p := range pids {
		if p == pid {
			t.Fatalf("backend %d of the timed-out connection served another call", pid)
		}
	}
}

func TestHotParentCancelIsNotATimeout(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{MaxConns: 2})
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	rtt, err := db.Hot(ctx, func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `SELECT pg_sleep(10)`)
		return err
	})
	if errors.Is(err, pg.ErrTimeout) || err == nil {
		t.Fatalf("err = %v, want the caller's cancellation, not ErrTimeout", err)
	}
	// Cancelled at 200 ms, not after the ten seconds of pg_sleep; the upper bound leaves room
	// for a loaded machine.
	if rtt < 200*time.Millisecond || rtt > 5*time.Second {
		t.Errorf("rtt = %v", rtt)
	}
	if s := db.Stats(); s.Timeouts != 0 || s.Destroyed != 1 {
		t.Errorf("Stats = %+v, want no timeout and one destroyed connection", s)
	}
}

func TestHotTx(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{StmtTimeout: 300 * time.Millisecond, MaxConns: 2})
	if err := db.Background(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `CREATE TABLE t (v int)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `INSERT INTO t VALUES (1)`)
		return err
	}

	if _, err := db.HotTx(t.Context(), insert); err != nil {
		t.Fatalf("committing: %v", err)
	}
	errFn := errors.New("fn failed")
	_, err := db.HotTx(t.Context(), func(ctx context.Context, q pg.Querier) error {
		if err := insert(ctx, q); err != nil {
			return err
		}
		return errFn
	})
	if err != errFn {
		t.Errorf("fn's error came back as %v, want it unchanged", err)
	}
	_, err = db.HotTx(t.Context(), func(ctx context.Context, q pg.Querier) error {
		if err := insert(ctx, q); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `SELECT pg_sleep(10)`)
		return err
	})
	if !errors.Is(err, pg.ErrTimeout) {
		t.Errorf("sleeping transaction: %v, want ErrTimeout", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 1 {
		t.Errorf("%d rows, want only the committed one", n)
	}
	if s := db.Stats(); s.Destroyed != 1 {
		t.Errorf("destroyed %d connections, want 1 (the rolled-back one is reusable)", s.Destroyed)
	}
}

func TestBackgroundTimeout(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{StmtTimeout: time.Millisecond, BackgroundTimeout: 300 * time.Millisecond, MaxConns: 2})
	err := db.Background(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `SELECT pg_sleep(0.1)`) // longer than StmtTimeout: that one does not apply
		return err
	})
	if err != nil {
		t.Fatalf("Background under its own timeout: %v", err)
	}
	err = db.BackgroundTx(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `SELECT pg_sleep(10)`)
		return err
	})
	if !errors.Is(err, pg.ErrTimeout) {
		t.Errorf("err = %v, want ErrTimeout", err)
	}
}

func TestAcquireTimeout(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{StmtTimeout: 300 * time.Millisecond, MaxConns: 1})
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- db.Background(context.Background(), func(context.Context, pg.Querier) error {
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	// The connection is held until Hot returns: without its own bound on the wait, Hot
	// would end only with this context, and not with ErrTimeout.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	rtt, err := db.Hot(ctx, func(context.Context, pg.Querier) error { return nil })
	close(release)
	if !errors.Is(err, pg.ErrTimeout) || rtt != 0 {
		t.Errorf("Hot on an exhausted pool: rtt %v err %v, want 0 and ErrTimeout", rtt, err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 10*time.Second {
		t.Errorf("waited %v, want about 300ms", d)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := db.Stats(); s.AcquireTimeouts != 1 || s.Timeouts != 0 || s.Destroyed != 0 {
		t.Errorf("Stats = %+v, want one acquire timeout only", s)
	}
}

func TestBrokenConnectionsAreDestroyed(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{MaxConns: 2})
	func() {
		defer func() { _ = recover() }()
		_, _ = db.Hot(t.Context(), func(context.Context, pg.Querier) error { panic("boom") })
	}()
	_, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Query(ctx, `SELECT generate_series(1, 100000)`) // rows left open
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `BEGIN`) // transaction left open
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := db.Stats(); s.Destroyed != 3 || s.Acquired != 0 {
		t.Errorf("Stats = %+v, want 3 destroyed and none acquired", s)
	}
	backendPID(t, db) // the pool still works
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  pg.Config
		want string
	}{
		{pg.Config{}, "Config.URL is required"},
		{pg.Config{URL: "host=/x", MaxConns: -1}, "Config.MaxConns"},
		{pg.Config{URL: "host=/x", StmtTimeout: -time.Second}, "Config.StmtTimeout"},
		{pg.Config{URL: "host=/x", BackgroundTimeout: -time.Second}, "Config.BackgroundTimeout"},
	} {
		_, err := pg.Open(t.Context(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v) = %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	for _, url := range []string{
		"postgres://jetgres:sekrit@localhost/jetgres?host=/nonexistent&connect_timeout=2",
		"host=/nonexistent user=jetgres password=sekrit connect_timeout=2",
		"host=/nonexistent user=jetgres password='sek rit' port=notaport",
	} {
		_, err := pg.Open(t.Context(), pg.Config{URL: url})
		if err == nil {
			t.Fatalf("Open(%s) succeeded", pg.Redact(url))
		}
		if strings.Contains(err.Error(), "sekrit") || strings.Contains(err.Error(), "sek rit") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pw@h:5432/db?sslmode=require": "postgres://u:xxxxx@h:5432/db?sslmode=require",
		"postgres://h/db?password=pw&user=u":        "postgres://h/db?password=xxxxx&user=u",
		"host=h password=pw user=u":                 "host=h password=xxxxx user=u",
		`host=h password = 'p w\'x' user=u`:         "host=h password = xxxxx user=u",
		"host=/run/pg user=u":                       "host=/run/pg user=u",
	} {
		if got := pg.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
