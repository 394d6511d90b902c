package pg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// StreamTotals is what one stream adds to the account's statistics.
type StreamTotals struct {
	Msgs  uint64
	Bytes uint64
}

// AllTotals reads the message and byte counts of every stream in one statement from the
// state rows, keyed by stream id. Account information needs these for every stream at
// once, and a read per stream grows with the number of streams past clients' timeouts.
func (db *DB) AllTotals(ctx context.Context) (map[int64]StreamTotals, error) {
	out := make(map[int64]StreamTotals)
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		clear(out)
		rows, err := q.Query(ctx, `SELECT stream_id, msgs, bytes FROM jetgres.stream_state`)
		if err != nil {
			return err
		}
		var id int64
		var t StreamTotals
		_, err = pgx.ForEachRow(rows, []any{&id, &t.Msgs, &t.Bytes}, func() error {
			out[id] = t
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: stream totals: %w", err)
	}
	return out, nil
}
