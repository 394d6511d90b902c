package pg_test

import (
	"context"
	"testing"
	"time"

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
	for _, shape := range []struct {
		name string
		open func(testing.TB) func(context.Context, []byte) error
	}{{"rows", pgtest.RowsInsert}, {"state", pgtest.StateInsert}} {
		b.Run(shape.name, func(b *testing.B) {
			op := shape.open(b)
			data := make([]byte, 128)
			pgtest.VersusInsert(b, shape.name, 2000, func(ctx context.Context) error { return op(ctx, data) })
		})
	}
}
