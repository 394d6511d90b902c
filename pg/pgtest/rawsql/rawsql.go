// Package rawsql gives tests connections of their own to PostgreSQL, for the SQL that package
// pg keeps to itself: reading pg's tables to check what it stored, holding locks to make the
// database slow, creating and dropping test databases. Code outside pg reaches pgx only
// through pg, pgtest and this package, and only tests use the latter two.
//
// It lives apart from pgtest, which starts its server with embedded/localpg, so that
// localpg's own tests can use it too.
package rawsql

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connectTimeout bounds Open's first connection.
const connectTimeout = 30 * time.Second

// Runner runs SQL: a Pool on any of its connections, or the transaction Pool.Tx hands its
// function on one.
type Runner interface {
	// Exec runs a statement and discards what it returns.
	Exec(ctx context.Context, sql string, args ...any) error
	// QueryRow runs a query for one row; its Scan reports an error when there is none.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Query runs a query; close the rows (or read them to the end) before the next statement.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Row is the one row QueryRow asked for.
type Row interface {
	Scan(dest ...any) error
}

// Rows are a query's rows, read one at a time with Next and Scan.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Pool is a small pool of connections to one database. It reconnects after the server
// restarts, like pg's pool. It is safe for concurrent use.
type Pool struct {
	queries
	pool *pgxpool.Pool
}

// Open connects to the database at url (a URL or keyword/value connection string, which may
// set pool_max_conns or application_name) and closes the pool when t ends.
func Open(t testing.TB, url string) *Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	db, err := Connect(ctx, url)
	if err != nil {
		t.Fatalf("rawsql: %v", err)
	}
	t.Cleanup(db.Close)
	return db
}

// Connect is Open for code without a test to tie the pool to: the caller closes it. It
// returns once the database has answered, so that a wrong url fails here.
func Connect(ctx context.Context, url string) (*Pool, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connecting: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting: %w", err)
	}
	return &Pool{queries: queries{pool}, pool: pool}, nil
}

// Close closes the pool, waiting for connections in use to come back.
func (db *Pool) Close() { db.pool.Close() }

// Tx runs fn in a transaction on one connection: BEGIN, fn, then COMMIT if fn returned nil
// and ROLLBACK otherwise. Locks fn takes are held until it returns.
func (db *Pool) Tx(ctx context.Context, fn func(ctx context.Context, q Runner) error) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	if err := fn(ctx, queries{tx}); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

// pgxQuerier is what a pool and a transaction of pgx have in common.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// queries is Runner over pgx, which keeps pgx's types out of this package's API.
type queries struct{ q pgxQuerier }

func (q queries) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.q.Exec(ctx, sql, args...)
	return err
}

func (q queries) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return q.q.QueryRow(ctx, sql, args...)
}

func (q queries) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	return q.q.Query(ctx, sql, args...)
}

// Strings runs sql, whose rows have one column, and returns that column as text, failing t
// on any error.
func (db *Pool) Strings(t testing.TB, sql string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// HoldRows locks, in a transaction of its own, the rows sql selects (it ends in FOR UPDATE),
// until the returned release is called or t ends: a test's way of making the database hang
// for whoever needs those rows.
func (db *Pool) HoldRows(t testing.TB, sql string, args ...any) (release func()) {
	t.Helper()
	locked := make(chan error, 1)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		err := db.Tx(context.Background(), func(ctx context.Context, q Runner) error {
			if err := q.Exec(ctx, sql, args...); err != nil {
				return err
			}
			locked <- nil
			<-done
			return nil
		})
		if err != nil {
			locked <- err
		}
	}()
	if err := <-locked; err != nil {
		t.Fatalf("lock rows: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(done)
			<-ended
		})
	}
	t.Cleanup(release)
	return release
}

// errRollback ends the transaction of an AppTx that does not commit.
var errRollback = errors.New("rawsql: rolled back on purpose")

// AppTx runs fn in a transaction of its own, as an application's, and commits it or, when
// commit is false, rolls it back; any other failure fails t.
func (db *Pool) AppTx(t testing.TB, ctx context.Context, commit bool, fn func(q Runner) error) {
	t.Helper()
	err := db.Tx(ctx, func(ctx context.Context, q Runner) error {
		if err := fn(q); err != nil {
			return err
		}
		if !commit {
			return errRollback
		}
		return nil
	})
	if err != nil && !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
}

// Publish calls jetgres.publish as an application does: headers is a JSON object, or ""
// for none.
func Publish(ctx context.Context, q Runner, subject, data, headers string) error {
	var h *string
	if headers != "" {
		h = &headers
	}
	return q.Exec(ctx, `SELECT jetgres.publish($1, $2::text, $3::jsonb)`, subject, data, h)
}
