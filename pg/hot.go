package pg

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrTimeout is returned (wrapped) when a call ran past its statement timeout, or waited longer
// than that for a connection. The statement was cancelled on the server. A timeout during
// COMMIT leaves the outcome unknown: the transaction may have committed, and Append and
// MoveStaged say so with ErrOutcomeUnknown.
var ErrTimeout = errors.New("pg: statement timeout")

// ErrUnavailable is returned (wrapped) when the database gave no answer: no connection could be
// had (the server is down or refuses), or the connection broke during the call (the server went
// away or terminated the backend). The round trip returned with it measures nothing about the
// database. As with ErrTimeout, a transaction whose COMMIT was in flight may have committed
// (ErrOutcomeUnknown).
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
// b runs in on q's connection, so that it costs no round trip of its own, and returns how
// many results the reader must skip for it. set_config with is_local is SET LOCAL as a
// function: it also holds in the implicit transaction of a pipeline without BEGIN, where SET
// LOCAL would only warn. A connection whose own setting is already the one asked for (see
// pinCommitMode) needs nothing queued: the statement would cost the lone publish a fifth of a
// bare INSERT.
func (db *DB) queueCommitMode(q querier, b *pgx.Batch) (results int) {
	if db.cfg.SynchronousCommit == "" {
		return 0
	}
	if c, ok := q.(interface{ PgConn() *pgconn.PgConn }); ok {
		if pinned, _ := c.PgConn().CustomData()[commitPinned].(bool); pinned {
			return 0
		}
	}
	b.Queue(`SELECT set_config('synchronous_commit', $1, true)`, db.cfg.SynchronousCommit)
	return 1
}

// commitPinned is the key of a connection's custom data that says its session's
// synchronous_commit is Config.SynchronousCommit.
const commitPinned = "jetgres.commit_pinned"

// pinCommitMode runs on every new connection. It makes the session's synchronous_commit, as
// the server, the role and the database set it, a setting of the session's own, which a
// later reload of the server's configuration cannot change under it; every statement keeps
// the server's setting as it was when the connection opened. Where that is already
// Config.SynchronousCommit, the append and cursor transactions need no setting of their own.
func (db *DB) pinCommitMode(ctx context.Context, c *pgx.Conn) error {
	if db.cfg.SynchronousCommit == "" {
		return nil
	}
	var mode string
	if err := c.QueryRow(ctx, `SELECT set_config('synchronous_commit', current_setting('synchronous_commit'), false)`).Scan(&mode); err != nil {
		return fmt.Errorf("reading synchronous_commit: %w", err)
	}
	c.PgConn().CustomData()[commitPinned] = mode == db.cfg.SynchronousCommit
	return nil
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

// readOnlyTransaction is the SQLSTATE of a write refused by a server that takes none.
const readOnlyTransaction = "25006"

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
	return db.runRetry(ctx, db.cfg.StmtTimeout, fn)
}

// background runs fn like hot, for work that bypasses the flow limiter (maintenance, admin,
// metrics), under Config.BackgroundTimeout.
func (db *DB) background(ctx context.Context, fn func(ctx context.Context, q querier) error) error {
	_, err := db.runRetry(ctx, db.cfg.BackgroundTimeout, fn)
	return err
}

// backgroundTx is background inside BEGIN … COMMIT: the transaction commits if fn returns nil
// and rolls back otherwise.
func (db *DB) backgroundTx(ctx context.Context, fn func(ctx context.Context, q querier) error) error {
	_, err := db.runRetry(ctx, db.cfg.BackgroundTimeout, func(ctx context.Context, q querier) error { return inTx(ctx, q, fn) })
	return err
}

func inTx(ctx context.Context, c querier, fn func(ctx context.Context, q querier) error) error {
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

// runRetry is run for fn written against querier, with one retry on a fresh connection when
// the pooled one turned out dead before anything reached the server: a backend terminated
// (pg_terminate_backend, a restarted server) while its connection sat idle in the pool would
// otherwise cost the whole call, a publish batch included. It retries only when the first
// statement fn sent on a live connection failed without a byte written (pgconn.SafeToRetry),
// so nothing fn did can have committed; a later statement's failure could follow a commit of
// fn's own, and is returned as it is.
func (db *DB) runRetry(ctx context.Context, timeout time.Duration, fn func(ctx context.Context, q querier) error) (time.Duration, error) {
	var q *sendCounter
	attempt := func(ctx context.Context, c *pgx.Conn) error {
		q = &sendCounter{Conn: c, prepares: &db.prepares}
		return fn(ctx, q)
	}
	rtt, err := db.run(ctx, timeout, attempt)
	if err == nil || q == nil || q.sent != 1 || !errors.Is(err, ErrUnavailable) || !pgconn.SafeToRetry(err) {
		return rtt, err
	}
	db.staleRetries.Add(1)
	db.log.Debug("pooled connection was dead before use; retrying on a live one", "err", err)
	return db.runOn(ctx, timeout, attempt, true)
}

// committedBefore is the error of a call that failed after an earlier call of the same fn
// committed. The failed call may have found the connection closed before it wrote anything,
// which pgx marks safe to retry, but running fn again would commit the earlier call's work a
// second time.
type committedBefore struct{ error }

func (e committedBefore) Unwrap() error { return e.error }

func (committedBefore) SafeToRetry() bool { return false }

// sendCounter counts the calls fn starts on a connection that is still open; a call on a
// connection already closed cannot reach the server.
type sendCounter struct {
	*pgx.Conn
	sent int
	// prepares counts the statements that the calls make pgx prepare on the connection (see
	// countPrepares). Each costs a parse and plan in PostgreSQL and, ahead
	// of its call, a round trip of its own.
	prepares *atomic.Int64
}

// countPrepares counts sql if the connection has not prepared it yet.
// It keeps a hash of each text it has seen on the connection, so that the set costs a few
// bytes per statement however long the text. pgx's statement cache forgets the least
// recently used statement past its capacity; once a connection has seen that many, the set
// starts afresh, and what is counted is then an upper bound: a connection that needs that
// many statements is what the count is there to show.
func (s *sendCounter) countPrepares(sql string) {
	cfg := s.Config()
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cfg.StatementCacheCapacity <= 0 {
		return
	}
	data := s.PgConn().CustomData()
	seen, _ := data[preparedTexts].(map[uint64]struct{})
	if seen == nil || len(seen) >= cfg.StatementCacheCapacity {
		seen = make(map[uint64]struct{})
		data[preparedTexts] = seen
	}
	h := maphash.String(textSeed, sql)
	if _, ok := seen[h]; !ok {
		seen[h] = struct{}{}
		s.prepares.Add(1)
	}
}

var textSeed = maphash.MakeSeed()

// preparedTexts is the key of a connection's custom data that holds the hashes of the
// statement texts countPrepares has seen on it.
const preparedTexts = "jetgres.prepared_texts"

func (s *sendCounter) count() {
	if !s.PgConn().IsClosed() {
		s.sent++
	}
}

func (s *sendCounter) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s.count()
	if len(args) > 0 { // pgx runs a statement without arguments unprepared
		s.countPrepares(sql)
	}
	return s.Conn.Exec(ctx, sql, args...)
}

func (s *sendCounter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s.count()
	s.countPrepares(sql)
	return s.Conn.Query(ctx, sql, args...)
}

func (s *sendCounter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	s.count()
	s.countPrepares(sql)
	return s.Conn.QueryRow(ctx, sql, args...)
}

func (s *sendCounter) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	s.count()
	return s.Conn.CopyFrom(ctx, table, columns, src)
}

func (s *sendCounter) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	s.count()
	for _, qq := range b.QueuedQueries {
		s.countPrepares(qq.SQL)
	}
	return s.Conn.SendBatch(ctx, b)
}

func (s *sendCounter) Begin(ctx context.Context) (pgx.Tx, error) {
	s.count()
	return s.Conn.Begin(ctx)
}

// run is the one path by which pg uses a pooled connection. timeout 0 means no timeout of
// run's own (Migrate: bounded by ctx only).
func (db *DB) run(ctx context.Context, timeout time.Duration, fn func(ctx context.Context, c *pgx.Conn) error) (rtt time.Duration, err error) {
	return db.runOn(ctx, timeout, fn, false)
}

// runOn is run on a connection that answered a ping first when live is set.
func (db *DB) runOn(ctx context.Context, timeout time.Duration, fn func(ctx context.Context, c *pgx.Conn) error, live bool) (rtt time.Duration, err error) {
	acquire := db.acquire
	if live {
		acquire = db.acquireLive
	}
	pc, err := acquire(ctx, timeout)
	if err != nil {
		return 0, err
	}
	stmtCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		stmtCtx, cancel = context.WithTimeoutCause(ctx, timeout, errStmtDeadline)
	}
	defer cancel()

	clean, readOnly := false, false
	defer func() {
		// A panic in fn leaves clean false: the connection's state is unknown, destroy it.
		db.release(pc, !clean || readOnly || stmtCtx.Err() != nil)
	}()
	start := time.Now()
	err = fn(stmtCtx, pc.Conn())
	rtt = time.Since(start)
	clean = true

	err = db.classifyDiskFull(err)
	if err != nil && context.Cause(stmtCtx) == errStmtDeadline {
		db.timeouts.Add(1)
		db.log.Debug("statement timeout", "timeout", timeout, "rtt", rtt, "backend_pid", pc.Conn().PgConn().PID(), "err", err)
		return rtt, fmt.Errorf("%w (%s): %w", ErrTimeout, timeout, err)
	}
	if hasSQLState(err, readOnlyTransaction) {
		// The server no longer takes writes: demoted to a standby, or made read-only ahead
		// of a switchover, with this connection still open. The connection goes, and the
		// next one finds the server that takes writes (target_session_attrs=read-write);
		// until one does, the database is unavailable. The statement was refused, so a
		// transaction it was part of did not commit.
		readOnly = true
		return rtt, fmt.Errorf("%w: %w", ErrUnavailable, err)
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

// acquireLive acquires a connection that answers a ping. The server that ended one idle
// connection has often ended them all (a restart, an administrator clearing a database), so
// the pool may hand out several dead ones in a row; each is destroyed, up to the pool's size.
func (db *DB) acquireLive(ctx context.Context, timeout time.Duration) (*pgxpool.Conn, error) {
	for range db.cfg.MaxConns {
		pc, err := db.acquire(ctx, timeout)
		if err != nil {
			return nil, err
		}
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			pctx, cancel = context.WithTimeout(ctx, timeout)
		}
		err = pc.Conn().Ping(pctx)
		cancel()
		if err == nil {
			return pc, nil
		}
		db.destroy(pc)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("acquiring a connection: %w", err)
		}
		if !pgconn.SafeToRetry(err) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	return db.acquire(ctx, timeout)
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
