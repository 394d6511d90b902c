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
