package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkAppendLone appends one message at a time, as a lone synchronous publisher makes
// the bridge do, against a bare INSERT committed on its own (pgtest.VersusInsert).
func BenchmarkAppendLone(b *testing.B) {
	db := pgtest.Open(b)
	st, err := db.CreateStream(context.Background(), "LONE", []byte(`{}`))
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	pgtest.VersusInsert(b, "append", 2000, func(ctx context.Context) error {
		_, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "lone.x", Data: data}}}}, time.Now().UnixNano())
		return err
	})
}

// BenchmarkAppendLoneFloor is what stops BenchmarkAppendLone from matching a bare INSERT,
// measured without any of package pg: the same SQL on one connection of plain pgx, against
// the bare INSERT in the same run. "rows" inserts into a table shaped as a chunk (a subject
// index besides the primary key), as one statement committed on its own; "state" is the fast
// path's statement itself, moving a stream's state row and inserting the row it allows.
// BenchmarkAppendLone's ratio above "state"'s is jetgres's own; "state"'s above "rows"' is
// the state row's; "rows"' above 1 is the subject index's.
func BenchmarkAppendLoneFloor(b *testing.B) {
	for _, shape := range []string{"rows", "state"} {
		b.Run(shape, func(b *testing.B) {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, pgtest.NewDB(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = conn.Close(context.Background()) })
			for _, ddl := range []string{
				`CREATE TABLE state (id bigint PRIMARY KEY, last_seq bigint NOT NULL, last_ts bigint NOT NULL,
					cum_bytes bigint NOT NULL, msgs bigint NOT NULL, bytes bigint NOT NULL, chunk_rows bigint NOT NULL)
					WITH (fillfactor = 10)`,
				`INSERT INTO state VALUES (1, 0, 0, 0, 0, 0, 0)`,
				`CREATE TABLE msgs (seq bigint PRIMARY KEY, ts bigint NOT NULL, subject text COLLATE "C" NOT NULL,
					hdr bytea, data bytea NOT NULL, cum_before bigint NOT NULL)`,
				`CREATE INDEX ON msgs (subject, seq)`,
			} {
				if _, err := conn.Exec(ctx, ddl); err != nil {
					b.Fatal(err)
				}
			}
			data := make([]byte, 128)
			var seq int64
			op := func(ctx context.Context) error {
				seq++
				_, err := conn.Exec(ctx, `INSERT INTO msgs VALUES ($1, $2, $3, $4, $5, $6)`, seq, seq, "lone.x", []byte(nil), data, seq)
				return err
			}
			if shape == "state" {
				op = func(ctx context.Context) error {
					seq++
					_, err := conn.Exec(ctx, `WITH u AS (UPDATE state SET last_seq = $2, last_ts = $3, cum_bytes = $4,
							msgs = msgs + 1, bytes = bytes + $5, chunk_rows = $2
							WHERE id = 1 AND last_seq = $1 RETURNING last_seq),
						i AS (INSERT INTO msgs SELECT r.* FROM u, (VALUES ($2::bigint, $3::bigint, $6::text, $7::bytea, $8::bytea, $9::bigint)) AS r)
						SELECT last_seq FROM u`, seq-1, seq, seq, seq*160, 160, "lone.x", []byte(nil), data, (seq-1)*160)
					return err
				}
			}
			pgtest.VersusInsert(b, shape, 2000, op)
		})
	}
}
