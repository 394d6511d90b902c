package pg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
)

// TestDiskFull checks that PostgreSQL's disk_full (SQLSTATE 53100, what it reports for a file
// it could not extend or create) reaches callers as pg.ErrDiskFull, on a live connection that
// stays usable, and is remembered for readiness; other errors are not taken for it. The
// e2e test TestDiskFullExternal fills a real disk.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{MaxConns: 1})
	if !db.LastDiskFull().IsZero() {
		t.Fatalf("LastDiskFull = %v before any refusal", db.LastDiskFull())
	}
	_, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `SELECT 1/0`)
		return err
	})
	if err == nil || errors.Is(err, pg.ErrDiskFull) || !db.LastDiskFull().IsZero() {
		t.Fatalf("division by zero: err = %v, LastDiskFull %v; want a plain server error", err, db.LastDiskFull())
	}

	before := time.Now()
	_, err = db.HotTx(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$`)
		return err
	})
	if !errors.Is(err, pg.ErrDiskFull) || errors.Is(err, pg.ErrUnavailable) {
		t.Fatalf("disk_full: err = %v, want pg.ErrDiskFull and not pg.ErrUnavailable", err)
	}
	if at := db.LastDiskFull(); at.Before(before) {
		t.Fatalf("LastDiskFull = %v, want after %v", at, before)
	}
	if err := db.Background(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `SELECT 1`)
		return err
	}); err != nil {
		t.Fatalf("the connection after a disk_full refusal: %v", err)
	}
}
