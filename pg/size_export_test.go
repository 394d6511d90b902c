package pg

import (
	"context"
	"fmt"
)

// SQLSizes reads back the size of each live message of a stream as each of the SQL paths
// computes it: sqlSize over the chunk rows, jetgres.stream_head and jetgres.subject_live,
// keyed by path and then by sequence. subject_live reads the given subjects.
func (db *DB) SQLSizes(ctx context.Context, id int64, subjects []string) (map[string]map[uint64]uint64, error) {
	out := map[string]map[uint64]uint64{"sqlSize": {}, "stream_head": {}, "subject_live": {}}
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		_, last, err := streamBounds(ctx, q, id)
		if err != nil {
			return err
		}
		read := func(path, sql string, args ...any) error {
			rows, err := q.Query(ctx, sql, args...)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var seq, size int64
				if err := rows.Scan(&seq, &size); err != nil {
					return err
				}
				out[path][uint64(seq)] = uint64(size)
			}
			return rows.Err()
		}
		chunks, err := db.chunks.list(ctx, q, id, last)
		if err != nil {
			return err
		}
		var memory bool
		if err := q.QueryRow(ctx, `SELECT memory FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&memory); err != nil {
			return err
		}
		for _, c := range chunks {
			if err := read("sqlSize", `SELECT seq, `+sqlSize(memory)+` FROM `+chunkTable(id, c.chunk)+` m WHERE `+liveRows, id); err != nil {
				return err
			}
		}
		if err := read("stream_head", `SELECT seq, size FROM jetgres.stream_head($1, NULL, $2)`, id, int(last)); err != nil {
			return err
		}
		return read("subject_live", `SELECT seq, size FROM jetgres.subject_live($1, $2, NULL)`, id, subjects)
	})
	if err != nil {
		return nil, fmt.Errorf("SQL sizes: %w", err)
	}
	return out, nil
}
