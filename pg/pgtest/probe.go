package pgtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ServerProbe looks at a PostgreSQL server from beside what a benchmark measures, on connections
// of its own: settings, pg_stat_statements, table statistics, and a snapshot held open as a
// lagging replica or a forgotten session would. It needs no testing.TB, so that the bench
// command can use it too. A ServerProbe is safe for concurrent use.
type ServerProbe struct {
	pool *pgxpool.Pool
}

// probeConns leaves a connection for statistics while HoldSnapshot holds one.
const probeConns = 4

// OpenProbe connects to the database at url.
func OpenProbe(ctx context.Context, url string) (*ServerProbe, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("probe: parse database URL: %w", err)
	}
	cfg.MaxConns = probeConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "jetgres-probe"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("probe: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("probe: connect: %w", err)
	}
	return &ServerProbe{pool: pool}, nil
}

// Close closes the connections.
func (p *ServerProbe) Close() { p.pool.Close() }

// Setting is the current value of a server setting, as SHOW prints it.
func (p *ServerProbe) Setting(ctx context.Context, name string) (string, error) {
	var v string
	if err := p.pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
		return "", fmt.Errorf("probe: read setting %s: %w", name, err)
	}
	return v, nil
}

// Checkpoint writes every dirty buffer out now (CHECKPOINT), so that what the server was
// yet to write back does not fall into the measurement that follows. It needs a superuser,
// or the pg_checkpoint role.
func (p *ServerProbe) Checkpoint(ctx context.Context) error {
	if _, err := p.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("probe: checkpoint: %w", err)
	}
	return nil
}

// EnableStatements creates the pg_stat_statements extension in the database. TopStatements
// also needs the server to preload the library (shared_preload_libraries).
func (p *ServerProbe) EnableStatements(ctx context.Context) error {
	if _, err := p.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return fmt.Errorf("probe: create extension pg_stat_statements: %w", err)
	}
	return nil
}

// Statement is one line of pg_stat_statements, its text on one line.
type Statement struct {
	Query   string
	Calls   int64
	TotalMs float64
	MeanMs  float64
	Rows    int64
}

// TopStatements returns the n statements the server spent the most execution time on, from
// pg_stat_statements (see EnableStatements).
func (p *ServerProbe) TopStatements(ctx context.Context, n int) ([]Statement, error) {
	rows, err := p.pool.Query(ctx, `SELECT regexp_replace(query, '\s+', ' ', 'g'), calls, total_exec_time, mean_exec_time, rows
		FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("probe: read pg_stat_statements: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Statement, error) {
		var s Statement
		err := row.Scan(&s.Query, &s.Calls, &s.TotalMs, &s.MeanMs, &s.Rows)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("probe: read pg_stat_statements: %w", err)
	}
	return out, nil
}

// TableStats is pg_stat_user_tables summed over a set of tables.
type TableStats struct {
	Tables     int
	Live, Dead int64
	// Bytes is the tables' size with their indexes and TOAST.
	Bytes int64
}

// TableStats sums the statistics of the tables in schema whose name is LIKE like. The counts
// lag the writes: PostgreSQL 15 and later publish a busy session's within ten seconds of it
// going idle.
func (p *ServerProbe) TableStats(ctx context.Context, schema, like string) (TableStats, error) {
	var s TableStats
	err := p.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(n_live_tup), 0), coalesce(sum(n_dead_tup), 0),
			coalesce(sum(pg_total_relation_size(relid)), 0)
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE $2`, schema, like).
		Scan(&s.Tables, &s.Live, &s.Dead, &s.Bytes)
	if err != nil {
		return TableStats{}, fmt.Errorf("probe: read pg_stat_user_tables: %w", err)
	}
	return s, nil
}

// HoldSnapshot opens a REPEATABLE READ transaction and takes its snapshot, which keeps
// VACUUM from removing any row version deleted after it until release is called.
func (p *ServerProbe) HoldSnapshot(ctx context.Context) (release func(), err error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, fmt.Errorf("probe: hold a snapshot: %w", err)
	}
	// A REPEATABLE READ transaction takes its snapshot at its first statement, not at BEGIN.
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM pg_class`); err != nil {
		_ = tx.Rollback(context.Background())
		return nil, fmt.Errorf("probe: hold a snapshot: %w", err)
	}
	return func() { _ = tx.Rollback(context.Background()) }, nil
}
