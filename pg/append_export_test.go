package pg

import (
	"context"
	"time"
)

// RetireIdleChunk exposes the maintainer's chunk rotation to tests of the append paths.
func (db *DB) RetireIdleChunk(ctx context.Context, id int64, idle time.Duration) error {
	return db.retireIdleChunk(ctx, id, idle)
}

// SubjectIndexed reports whether the stream has a subject index, the fast path's way
// through a per-subject limit.
func (db *DB) SubjectIndexed(id int64) bool {
	return db.subjects.peek(id, func(*subjectIndex) {})
}

// LiveBySubject counts the live messages of each of the given subjects, from the rows.
func (db *DB) LiveBySubject(ctx context.Context, id int64, subjects []string) (map[string]int, error) {
	out := make(map[string]int)
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT subject, count(*) FROM jetgres.subject_live($1, $2, NULL) GROUP BY subject`, id, subjects)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s string
			var n int
			if err := rows.Scan(&s, &n); err != nil {
				return err
			}
			out[s] = n
		}
		return rows.Err()
	})
	return out, err
}

// RememberedLastSeq is the last sequence this process remembers for a stream, the fast
// path's starting point, and whether it remembers one.
func (db *DB) RememberedLastSeq(id int64) (uint64, bool) {
	st, ok := db.tails.get(id)
	return st.lastSeq, ok
}
