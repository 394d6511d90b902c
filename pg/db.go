package pg

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// applicationName shows in pg_stat_activity unless the URL names another.
const applicationName = "jetgres"

// DB is a pool of connections to one PostgreSQL database. It is safe for concurrent use.
type DB struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger

	timeouts        atomic.Int64
	acquireTimeouts atomic.Int64
	destroyed       atomic.Int64
	staleRetries    atomic.Int64
	prepares        atomic.Int64
	// closing tracks destroyed connections whose sockets pgx is still closing in the
	// background, so that Close returns only when they are gone.
	closing sync.WaitGroup

	chunks chunkCache // see chunks.go
	tails  tailStates // see append_fast.go

	subjects subjectIndexes // see subject_index.go
	lasts    derivedLasts   // see append_derive.go
	counts   subjectCounts  // see subject_count.go

	offset clockOffset // see clock.go
	server serverWatch // see server.go

	diskFullAt atomic.Int64 // unix nanoseconds; see diskfull.go
}

// Open builds the pool and returns once the database has answered a ping, so that a wrong URL
// or an unreachable server fails here and not on the first publish. ctx bounds that first
// connection. Errors and logs show the URL with its password redacted.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("pg: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// pgx's parse errors redact the password themselves.
		return nil, fmt.Errorf("pg: Config.URL: %w", err)
	}
	db := &DB{cfg: cfg, log: cfg.Logger,
		subjects: subjectIndexes{newStreamCache[*subjectIndex](SubjectIndexRows)},
		lasts:    derivedLasts{newStreamCache[*streamLasts](DerivedSubjectsMax)},
		counts:   newSubjectCounts()}
	pcfg.MaxConns = cfg.MaxConns
	if _, ok := pcfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		pcfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	}
	// PostgreSQL's default (jit = on) compiles any statement the planner costs above
	// jit_above_cost, and a read of a thousand messages from a large chunk costs that: the
	// compile takes 100-200 ms where the read takes 1 ms. jetgres's statements are short and
	// run again and again, so JIT never pays for itself on them. A URL that sets jit wins.
	if _, ok := pcfg.ConnConfig.RuntimeParams["jit"]; !ok {
		pcfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	if cfg.Keepalive > 0 {
		for k, v := range keepaliveParams(cfg.Keepalive) {
			if _, ok := pcfg.ConnConfig.RuntimeParams[k]; !ok {
				pcfg.ConnConfig.RuntimeParams[k] = v
			}
		}
	}
	pcfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { return newServerCancel(c) }
	// A connection can come back to the pool marked by pgx-internal work, such as the liveness
	// ping pgxpool runs on acquire, having been cancelled.
	pcfg.PrepareConn = func(_ context.Context, c *pgx.Conn) (bool, error) { return !cancelSent(c), nil }
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if err := noteSession(ctx, c); err != nil {
			return err
		}
		if err := db.noteServer(ctx, c); err != nil {
			return err
		}
		return db.pinCommitMode(ctx, c)
	}

	db.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("pg: creating pool for %s: %w", Redact(cfg.URL), err)
	}
	// The first connection may be slow to set up (TLS, authentication): give it the longer budget.
	if err := db.ping(ctx, cfg.BackgroundTimeout); err != nil {
		db.Close()
		return nil, fmt.Errorf("pg: connecting to %s: %w", Redact(cfg.URL), err)
	}
	db.log.Info("connected to PostgreSQL", "url", Redact(cfg.URL), "max_conns", cfg.MaxConns,
		"stmt_timeout", cfg.StmtTimeout, "background_timeout", cfg.BackgroundTimeout)
	return db, nil
}

// Close closes the pool. It waits for connections in use to be returned, so call it after
// the work using the DB has stopped. It is safe to call more than once.
func (db *DB) Close() {
	db.pool.Close()
	db.closing.Wait()
}

// Ping checks that the database answers within the statement timeout.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.ping(ctx, db.cfg.StmtTimeout); err != nil {
		return fmt.Errorf("pg: ping: %w", err)
	}
	return nil
}

func (db *DB) ping(ctx context.Context, timeout time.Duration) error {
	_, err := db.runRetry(ctx, timeout, func(ctx context.Context, q querier) error {
		s := q.(*sendCounter)
		s.count()
		return s.Ping(ctx)
	})
	return err
}

// Stats is a snapshot of the pool and of pg's timeout accounting.
type Stats struct {
	Acquired int32 // connections in use now
	Idle     int32 // connections waiting in the pool
	Total    int32 // open connections, including ones being established
	Max      int32 // Config.MaxConns

	AcquireCount      int64         // connections handed out since Open
	EmptyAcquireCount int64         // of which the caller had to wait because none was idle
	AcquireWait       time.Duration // total time callers waited for a connection

	Timeouts            int64 // calls that ran past their statement timeout
	AcquireTimeouts     int64 // calls whose wait for a connection ran past the timeout
	Destroyed           int64 // connections destroyed after a timeout, a cancellation or a broken state
	StaleRetries        int64 // calls retried on a fresh connection because the pooled one was dead before use
	Prepares            int64 // statements prepared on a pooled connection for a call of the hot path or the background
	SubjectIndexDropped int64 // subject indexes dropped for going past SubjectIndexRows
	SubjectCountDropped int64 // subject sets of stream infos not kept for going past SubjectCountBytes
	DerivedLastsDropped int64 // streams' remembered last messages not kept for going past DerivedSubjectsMax
}

// Stats returns the current pool statistics.
func (db *DB) Stats() Stats {
	s := db.pool.Stat()
	return Stats{
		Acquired:            s.AcquiredConns(),
		Idle:                s.IdleConns(),
		Total:               s.TotalConns(),
		Max:                 s.MaxConns(),
		AcquireCount:        s.AcquireCount(),
		EmptyAcquireCount:   s.EmptyAcquireCount(),
		AcquireWait:         s.AcquireDuration(),
		Timeouts:            db.timeouts.Load(),
		AcquireTimeouts:     db.acquireTimeouts.Load(),
		Destroyed:           db.destroyed.Load(),
		StaleRetries:        db.staleRetries.Load(),
		Prepares:            db.prepares.Load(),
		SubjectIndexDropped: db.subjects.dropped.Load(),
		SubjectCountDropped: db.counts.dropped.Load(),
		DerivedLastsDropped: db.lasts.dropped.Load(),
	}
}
