package pg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jetgres/jetgres/pg"
)

// TestUnavailable tells a database that gave no answer (its backend ended under the call, or
// no connection could be had) from one that answered with an error.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{MaxConns: 1})
	observer := openDB(t, pg.Config{MaxConns: 1})

	// An error the server answers is a round trip like any other.
	_, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `SELECT 1/0`)
		return err
	})
	if err == nil || errors.Is(err, pg.ErrUnavailable) || errors.Is(err, pg.ErrTimeout) {
		t.Fatalf("division by zero: err = %v, want a plain server error", err)
	}

	// The backend is terminated while the call is on it, after its first statement was
	// answered: the call fails, and is not run again, since that statement may have committed.
	// (A backend terminated between calls costs nothing: see TestAppendAfterIdleBackendsTerminated.)
	calls := 0
	_, err = db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		calls++
		var pid int32
		if err := q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		if err := observer.Background(t.Context(), func(ctx context.Context, q pg.Querier) error {
			_, err := q.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		_, err := q.Exec(ctx, `SELECT 1`)
		return err
	})
	if !errors.Is(err, pg.ErrUnavailable) || errors.Is(err, pg.ErrTimeout) || calls != 1 {
		t.Fatalf("call on a backend terminated under it: err = %v after %d runs, want ErrUnavailable after one", err, calls)
	}
	backendPID(t, db) // a new connection serves the next call

	// The database goes away: no connection can be had.
	var name string
	if _, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
		return q.QueryRow(ctx, `SELECT current_database()`).Scan(&name)
	}); err != nil {
		t.Fatal(err)
	}
	if err := observer.Background(t.Context(), func(ctx context.Context, q pg.Querier) error {
		_, err := q.Exec(ctx, `DROP DATABASE "`+name+`" WITH (FORCE)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first call may still find the dead connection in the pool
		rtt, err := db.Hot(t.Context(), func(ctx context.Context, q pg.Querier) error {
			_, err := q.Exec(ctx, `SELECT 1`)
			return err
		})
		if !errors.Is(err, pg.ErrUnavailable) {
			t.Fatalf("call on a dropped database: rtt %v, err = %v, want ErrUnavailable", rtt, err)
		}
	}
	// A caller that gave up is told so, not that the database is unavailable.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := db.Hot(ctx, func(ctx context.Context, q pg.Querier) error { return nil }); !errors.Is(err, context.Canceled) || errors.Is(err, pg.ErrUnavailable) {
		t.Fatalf("call with a cancelled context: err = %v, want context.Canceled only", err)
	}
}
