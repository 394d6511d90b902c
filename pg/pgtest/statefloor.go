package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetgres/jetgres/pg"
)

// chunkShaped opens one connection to a fresh database holding a stream's state row and a
// table shaped as a chunk (primary key on seq, an index on subject and seq), for the floors
// below.
func chunkShaped(tb testing.TB) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, NewDB(tb))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, ddl := range append([]string{
		`CREATE TABLE state (id bigint PRIMARY KEY, last_seq bigint NOT NULL, last_ts bigint NOT NULL,
			cum_bytes bigint NOT NULL, msgs bigint NOT NULL, bytes bigint NOT NULL, chunk_rows bigint NOT NULL)
			WITH (fillfactor = 10)`,
		`INSERT INTO state VALUES (1, 0, 0, 0, 0, 0, 0)`,
	}, pg.ChunkShapeDDL("msgs")...) {
		if _, err := conn.Exec(ctx, ddl); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
	}
	return conn
}

// RowsInsert returns the insert of one message into a table shaped as a chunk, committed on
// its own, on one connection of a fresh database: a bare INSERT with the chunk's subject
// index. The function it returns is not safe for concurrent use.
func RowsInsert(tb testing.TB) func(ctx context.Context, data []byte) error {
	conn := chunkShaped(tb)
	var seq int64
	return func(ctx context.Context, data []byte) error {
		seq++
		_, err := conn.Exec(ctx, `INSERT INTO msgs VALUES ($1, $2, $3, $4, $5, $6)`, seq, seq, "lone.x", []byte(nil), data, seq)
		return err
	}
}

// StateInsert returns the least SQL a publish to a stream with dense sequences needs on
// jetgres's schema, on one connection of a fresh database: one statement, committed on its
// own, that moves the state row guarded by its last sequence and inserts the message into
// the table shaped as a chunk, as the append's fast path does. It is RowsInsert with the
// state row added, the floor of a lone publish that keeps its stream's sequence dense. The
// function it returns is not safe for concurrent use.
func StateInsert(tb testing.TB) func(ctx context.Context, data []byte) error {
	conn := chunkShaped(tb)
	var seq, cum int64
	return func(ctx context.Context, data []byte) error {
		size := int64(len(data)) + 32
		_, err := conn.Exec(ctx, `WITH u AS (UPDATE state SET last_seq = $2, last_ts = $3, cum_bytes = $4,
				msgs = msgs + 1, bytes = bytes + $5, chunk_rows = $2
				WHERE id = 1 AND last_seq = $1 RETURNING last_seq),
			i AS (INSERT INTO msgs SELECT r.* FROM u, (VALUES ($2::bigint, $3::bigint, $6::text, $7::bytea, $8::bytea, $9::bigint)) AS r)
			SELECT last_seq FROM u`, seq, seq+1, seq+1, cum+size, size, "lone.x", []byte(nil), data, cum)
		if err == nil {
			seq, cum = seq+1, cum+size
		}
		return err
	}
}
