package pg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// perSubject runs one per-subject query on each chunk of a stream up to upTo, over the live
// rows whose subject matches filters (all when empty): SELECT <sel> ... <tail>, where sel
// yields a subject and a number, each row handed to row.
func (db *DB) perSubject(ctx context.Context, q querier, streamID int64, filters []string, upTo uint64, sel, tail string, row func(subject string, n int64)) error {
	chunks, err := db.chunks.list(ctx, q, streamID, upTo)
	if err != nil {
		return err
	}
	cond, arg := subjectCond(filters, 3)
	for _, c := range chunks {
		args := []any{streamID, int64(upTo)}
		if arg != nil {
			args = append(args, arg)
		}
		rows, err := q.Query(ctx, `SELECT `+sel+` FROM `+chunkTable(streamID, c.chunk)+` m
			WHERE seq <= $2 AND `+liveRows+cond+` `+tail, args...)
		if err != nil {
			if isUndefinedTable(err) {
				continue // retention dropped it: nothing in it is live
			}
			return err
		}
		for rows.Next() {
			var subj string
			var n int64
			if err := rows.Scan(&subj, &n); err != nil {
				rows.Close()
				return err
			}
			row(subj, n)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// SubjectTotals counts the live messages of each subject that matches filter: the subjects of
// a stream info request with subjects_filter.
func (db *DB) SubjectTotals(ctx context.Context, streamID int64, filter string) (map[string]uint64, error) {
	totals := make(map[string]uint64)
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		_, last, err := streamBounds(ctx, q, streamID)
		if err != nil {
			return err
		}
		return db.perSubject(ctx, q, streamID, []string{filter}, last, `subject, count(*)`, `GROUP BY subject`,
			func(subj string, n int64) { totals[subj] += uint64(n) })
	})
	if err != nil {
		return nil, fmt.Errorf("pg: subject totals: %w", err)
	}
	return totals, nil
}

// DeletedSeqs lists, lowest first, the sequences between the stream's first and last that
// were removed one by one: the deleted details of a stream info request.
func (db *DB) DeletedSeqs(ctx context.Context, streamID int64) ([]uint64, error) {
	var out []uint64
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT d.seq FROM jetgres.deleted d JOIN jetgres.stream_state st USING (stream_id)
			WHERE d.stream_id = $1 AND d.seq >= st.first_seq AND d.seq <= st.last_seq ORDER BY d.seq`, streamID)
		if err != nil {
			return err
		}
		out, err = collectSeqs(rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: deleted sequences: %w", err)
	}
	return out, nil
}

// collectSeqs reads rows of one bigint column of sequences, as uint64s.
func collectSeqs(rows pgx.Rows) ([]uint64, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (uint64, error) {
		var s int64
		err := row.Scan(&s)
		return uint64(s), err
	})
}
