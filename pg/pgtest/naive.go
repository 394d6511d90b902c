package pgtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The naive queue's table is NaiveSchema.NaiveTable. It names its schema because the
// connection's default may be jetgres's own: jetgres's role is often named jetgres, like its
// schema, and "$user" comes first in the default search_path.
const (
	NaiveSchema = "public"
	NaiveTable  = "jetgres_naive"
	naiveTable  = NaiveSchema + "." + NaiveTable
)

// fillPipeline is how many of Fill's INSERTs share a round trip.
const fillPipeline = 1000

// Naive is a queue in PostgreSQL with no design at all, the baseline that benchmarks set
// jetgres beside: one table, one row per message; a publish is one INSERT committed on its
// own, and a consumer locks a batch with SKIP LOCKED and deletes its rows one DELETE per ack,
// as queue libraries built on a table do. It talks to PostgreSQL with pgx directly rather
// than through package pg, because the baseline must be the bare client round trip with none
// of jetgres's machinery in it. It needs no testing.TB, so that the bench command can use
// it too. A Naive is safe for concurrent use.
type Naive struct {
	pool *pgxpool.Pool
}

// OpenNaive connects to the database at url with a pool of up to conns connections. It does
// not create the table: Reset does.
func OpenNaive(ctx context.Context, url string, conns int) (*Naive, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("naive queue: parse database URL: %w", err)
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["application_name"] = "jetgres-naive"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("naive queue: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("naive queue: connect: %w", err)
	}
	return &Naive{pool: pool}, nil
}

// Close closes the connections; the table stays.
func (q *Naive) Close() { q.pool.Close() }

// Reset drops the table and creates it empty, so that every measurement inserts into the
// same fresh B-tree that a jetgres stream starts with.
func (q *Naive) Reset(ctx context.Context) error {
	if err := q.Drop(ctx); err != nil {
		return err
	}
	_, err := q.pool.Exec(ctx, `CREATE TABLE `+naiveTable+` (
	seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	subject text NOT NULL,
	data    bytea NOT NULL,
	stored  timestamptz NOT NULL DEFAULT now()
)`)
	if err != nil {
		return fmt.Errorf("naive queue: create table %s: %w", naiveTable, err)
	}
	return nil
}

// Drop drops the table if it exists.
func (q *Naive) Drop(ctx context.Context) error {
	if _, err := q.pool.Exec(ctx, `DROP TABLE IF EXISTS `+naiveTable); err != nil {
		return fmt.Errorf("naive queue: drop table %s: %w", naiveTable, err)
	}
	return nil
}

const insertSQL = `INSERT INTO ` + naiveTable + ` (subject, data) VALUES ($1, $2)`

// Insert is one publish: one INSERT, committed on its own.
func (q *Naive) Insert(ctx context.Context, subject string, data []byte) error {
	_, err := q.pool.Exec(ctx, insertSQL, subject, data)
	return err
}

// Fill inserts n messages, one INSERT statement each, pipelined so that filling the queue
// does not dominate a run that is about consuming it.
func (q *Naive) Fill(ctx context.Context, subject string, data []byte, n int) error {
	for done := 0; done < n; {
		batch := &pgx.Batch{}
		for range min(fillPipeline, n-done) {
			batch.Queue(insertSQL, subject, data)
			done++
		}
		if err := q.pool.SendBatch(ctx, batch).Close(); err != nil {
			return fmt.Errorf("naive queue: fill: %w", err)
		}
	}
	return nil
}

// Drain consumes the queue with workers sessions at once: each locks up to batch rows with
// SKIP LOCKED and deletes them one DELETE per row, in one transaction per batch, until it
// finds no row left to lock. acked counts the rows deleted, as they go. The first error
// stops every worker and is returned.
func (q *Naive) Drain(ctx context.Context, workers, batch int, acked *atomic.Int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range workers {
		wg.Go(func() {
			for {
				n, err := q.drainBatch(ctx, batch)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("naive queue: drain: %w", err); cancel() })
					return
				}
				if n == 0 {
					return
				}
				acked.Add(int64(n))
			}
		})
	}
	wg.Wait()
	return firstErr
}

func (q *Naive) drainBatch(ctx context.Context, batch int) (n int, err error) {
	err = pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT seq FROM `+naiveTable+` ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED`, batch)
		if err != nil {
			return err
		}
		seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		for _, seq := range seqs {
			b.Queue(`DELETE FROM `+naiveTable+` WHERE seq = $1`, seq)
		}
		n = len(seqs)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// BareInsert returns one publish of the naive queue on a fresh database of its own, on one
// connection: what a queue in PostgreSQL with no design at all does for one message. The
// returned function must not be called concurrently.
func BareInsert(t testing.TB) func(ctx context.Context, data []byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	q, err := OpenNaive(ctx, NewDB(t), 1)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(q.Close)
	if err := q.Reset(ctx); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return func(ctx context.Context, data []byte) error {
		return q.Insert(ctx, "naive.x", data)
	}
}
