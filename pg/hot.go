package pg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrTimeout is returned (wrapped) when a call ran past its statement timeout, or waited longer
// than that for a connection. The statement was cancelled on the server. A timeout during
// COMMIT leaves the outcome unknown: the transaction may have committed.
var ErrTimeout = errors.New("pg: statement timeout")

// ErrUnavailable is returned (wrapped) when the database gave no answer: no connection could be
// had (the server is down or refuses), or the connection broke during the call (the server went
// away or terminated the backend). The round trip returned with it measures nothing about the
// database. As with ErrTimeout, a transaction whose COMMIT was in flight may have committed.
var ErrUnavailable = errors.New("pg: database unavailable")

// querier runs statements on one connection or inside one transaction; both *pgx.Conn and
// pgx.Tx satisfy it. Begin on a transaction opens a savepoint. It stays inside pg, with every
// other pgx type: callers outside use *DB's methods, in pg's own types.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Causes tell our own deadlines from the caller's: context.Cause reports these only when our
// timer fired first.
var (
	errStmtDeadline    = errors.New("statement deadline")
	errAcquireDeadline = errors.New("connection wait deadline")
)

// queueCommitMode queues, as b's next statement, Config.SynchronousCommit for the transaction
// b runs in, so that it costs no round trip of its own, and returns how many results the
// reader must skip for it. set_config with is_local is SET LOCAL as a function: it also holds
// in the implicit transaction of a pipeline without BEGIN, where SET LOCAL would only warn.
func (db *DB) queueCommitMode(b *pgx.Batch) (results int) {
	if db.cfg.SynchronousCommit == "" {
		return 0
	}
	b.Queue(`SELECT set_config('synchronous_commit', $1, true)`, db.cfg.SynchronousCommit)
	return 1
}

// skipResults reads and discards the next n results of br.
func skipResults(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// closeTimeout bounds sending Terminate to a connection being destroyed.
const closeTimeout = time.Second

// hot runs fn on one pooled connection under the statement timeout, for the hot-path methods
// (Append, ReadFiltered, WriteCursor), which hand the round trip to the caller's Vegas limiter.
// It returns the round trip: the time from having the connection to fn returning, recorded
// whatever the outcome (waiting for the connection is not included; rtt is zero when no
// connection was had, and then there is nothing to record). On timeout the statement is cancelled on the server (an out-of-band
// cancel request) and the connection is destroyed, never returned to the pool; the error wraps
// ErrTimeout. The wait for a connection is bounded by ctx and, separately, by the statement
// timeout. fn's own errors are returned unchanged; fn must not keep q or rows past its return.
func (db *DB) hot(ctx context.Context, fn func(ctx context.Context, q querier) error) (rtt time.Duration, err error) {
	return db.run(ctx, db.cfg.StmtTimeout, func(ctx context.Context, c *pgx.Conn) error { return fn(ctx, c) })
}

// background runs fn like hot, for work that bypasses the flow limiter (maintenance, admin,
// metrics), under Config.BackgroundTimeout.
func (db *DB) background(ctx context.Context, fn func(ctx context.Context, q querier) error) error {
	_, err := db.run(ctx, db.cfg.BackgroundTimeout, func(ctx context.Context, c *pgx.Conn) error { return fn(ctx, c) })
	return err
}

// backgroundTx is background inside BEGIN … COMMIT: the transaction commits if fn returns nil
// and rolls back otherwise.
func (db *DB) backgroundTx(ctx context.Context, fn func(ctx context.Context, q querier) error) error {
	_, err := db.run(ctx, db.cfg.BackgroundTimeout, func(ctx context.Context, c *pgx.Conn) error { return inTx(ctx, c, fn) })
	return err
}

func inTx(ctx context.Context, c *pgx.Conn, fn func(ctx context.Context, q querier) error) error {
	tx, err := c.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	if err := fn(ctx, tx); err != nil {
		// Past the deadline a ROLLBACK would fail at once; the connection is destroyed
		// instead, which ends the transaction on the server.
		if ctx.Err() == nil {
			_ = tx.Rollback(ctx)
		}
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}

// run is the one path by which pg uses a pooled connection. timeout 0 means no timeout of
// run's own (Migrate: bounded by ctx only).
func (db *DB) run(ctx context.Context, timeout time.Duration, fn func(ctx context.Context, c *pgx.Conn) error) (rtt time.Duration, err error) {
	pc, err := db.acquire(ctx, timeout)
	if err != nil {
		return 0, err
	}
	stmtCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		stmtCtx, cancel = context.WithTimeoutCause(ctx, timeout, errStmtDeadline)
	}
	defer cancel()

	clean := false
	defer func() {
		// A panic in fn leaves clean false: the connection's state is unknown, destroy it.
		db.release(pc, !clean || stmtCtx.Err() != nil)
	}()
	start := time.Now()
	err = fn(stmtCtx, pc.Conn())
	rtt = time.Since(start)
	clean = true

	if err != nil && context.Cause(stmtCtx) == errStmtDeadline {
		db.timeouts.Add(1)
		db.log.Debug("statement timeout", "timeout", timeout, "rtt", rtt, "backend_pid", pc.Conn().PgConn().PID(), "err", err)
		return rtt, fmt.Errorf("%w (%s): %w", ErrTimeout, timeout, err)
	}
	if err != nil && ctx.Err() == nil && pc.Conn().PgConn().IsClosed() {
		// pgx closes a connection whose socket failed or that the server ended (a FATAL
		// error, such as a shutdown terminating the backend); an error the server answered
		// on a live connection leaves it open.
		return rtt, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return rtt, err
}

func (db *DB) acquire(ctx context.Context, timeout time.Duration) (*pgxpool.Conn, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		actx, cancel = context.WithTimeoutCause(ctx, timeout, errAcquireDeadline)
	}
	defer cancel()
	pc, err := db.pool.Acquire(actx)
	if err == nil {
		return pc, nil
	}
	if context.Cause(actx) == errAcquireDeadline {
		db.acquireTimeouts.Add(1)
		return nil, fmt.Errorf("%w (%s) waiting for a connection: %w", ErrTimeout, timeout, err)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("acquiring a connection: %w", err)
	}
	return nil, fmt.Errorf("%w: acquiring a connection: %w", ErrUnavailable, err)
}

// release returns a connection to the pool only if it is certainly reusable: idle, outside a
// transaction, and never the target of a cancel request.
func (db *DB) release(pc *pgxpool.Conn, destroy bool) {
	c := pc.Conn()
	p := c.PgConn()
	if destroy || cancelSent(c) || p.IsClosed() || p.IsBusy() || p.TxStatus() != 'I' {
		db.destroy(pc)
		return
	}
	pc.Release()
}

// destroy takes the connection out of the pool and closes it, which ends its backend. pgx may
// still be closing the socket in the background after a failed read; Close waits for that.
func (db *DB) destroy(pc *pgxpool.Conn) {
	db.destroyed.Add(1)
	db.closing.Add(1)
	c := pc.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = c.Close(ctx)
	done := c.PgConn().CleanupDone()
	select {
	case <-done:
		db.closing.Done()
	default:
		go func() {
			defer db.closing.Done()
			<-done
		}()
	}
}
