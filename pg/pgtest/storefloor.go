package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetgres/jetgres/pg"
)

// The store floor's table is StoreFloorSchema.StoreFloorTable, in a named schema for the
// reason the naive queue's is.
const (
	StoreFloorSchema = "public"
	StoreFloorTable  = "jetgres_store_floor"
	storeFloorTable  = StoreFloorSchema + "." + StoreFloorTable
)

// FloorMsg is one message a StoreFloor stores.
type FloorMsg struct {
	Subject string
	Data    []byte
}

// StoreFloor is the least that a gateway storing publishes in PostgreSQL before it
// acknowledges them can do for a batch: one COPY into a table shaped as jetgres's chunk
// tables are (pg.ChunkShapeDDL; no stream state, no message ids, no limits), with sequences assigned in Go, committed with
// synchronous_commit on, so that the commit waits for the WAL flush as a PubAck of jetgres
// with --synchronous-commit on does. It talks to PostgreSQL with pgx directly, for the same
// reason as Naive. A StoreFloor is not safe for concurrent use: it has one batch in flight
// at a time, as jetgres flushes one stream at a time.
type StoreFloor struct {
	pool *pgxpool.Pool
	last uint64 // the sequence of the last message committed
}

// OpenStoreFloor connects to the database at url on a connection of its own and creates the
// table empty, dropping one left behind.
func OpenStoreFloor(ctx context.Context, url string) (*StoreFloor, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store floor: parse database URL: %w", err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "jetgres-store-floor"
	// The server's default may be off; the floor is what a durable PubAck costs.
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store floor: connect: %w", err)
	}
	f := &StoreFloor{pool: pool}
	if err := f.create(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return f, nil
}

func (f *StoreFloor) create(ctx context.Context) error {
	for _, sql := range append([]string{`DROP TABLE IF EXISTS ` + storeFloorTable}, pg.ChunkShapeDDL(storeFloorTable)...) {
		if _, err := f.pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("store floor: create table %s: %w", storeFloorTable, err)
		}
	}
	return nil
}

// Store writes msgs with one COPY in one transaction and commits; the i-th message has
// sequence first+i. A batch that fails takes no sequences, so the next one continues where
// the last commit ended.
func (f *StoreFloor) Store(ctx context.Context, msgs []FloorMsg) (first uint64, err error) {
	first = f.last + 1
	ts := time.Now().UnixNano()
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{StoreFloorSchema, StoreFloorTable}, []string{"seq", "ts", "subject", "data", "cum_before"},
			pgx.CopyFromSlice(len(msgs), func(i int) ([]any, error) {
				return []any{int64(first) + int64(i), ts, msgs[i].Subject, msgs[i].Data, int64(0)}, nil
			}))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store floor: store %d messages: %w", len(msgs), err)
	}
	f.last += uint64(len(msgs))
	return first, nil
}

// Close drops the table and closes the connection.
func (f *StoreFloor) Close(ctx context.Context) error {
	defer f.pool.Close()
	if _, err := f.pool.Exec(ctx, `DROP TABLE IF EXISTS `+storeFloorTable); err != nil {
		return fmt.Errorf("store floor: drop table %s: %w", storeFloorTable, err)
	}
	return nil
}
