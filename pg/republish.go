package pg

import (
	"context"
	"fmt"
)

// LastSeqsBefore is, for each of subjects, the sequence of the stream's last message of that
// subject in [from, before), where it has one: what a republished message reports as
// Nats-Last-Sequence. nats-server reads it just before it stores a message, so a row that the
// same commit tombstoned or moved below the first sequence still counts here; rows whose
// chunk was dropped do not.
func (db *DB) LastSeqsBefore(ctx context.Context, streamID int64, subjects []string, from, before uint64) (map[string]uint64, error) {
	out := make(map[string]uint64, len(subjects))
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		clear(out)
		rows, err := q.Query(ctx, `SELECT s.subject, (SELECT max(m.seq) FROM jetgres.msgs m
				WHERE m.stream_id = $1 AND m.subject = s.subject COLLATE "C" AND m.seq >= $4 AND m.seq < $3)
			FROM unnest($2::text[]) AS s(subject)`, customPlan, streamID, subjects, int64(before), int64(from))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var subject string
			var seq *int64
			if err := rows.Scan(&subject, &seq); err != nil {
				return err
			}
			if seq != nil {
				out[subject] = uint64(*seq)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("pg: last sequences of subjects: %w", err)
	}
	return out, nil
}
