package pg

import (
	"context"
	"fmt"
)

// CheckHoldings recounts what a stream holds from its rows and tombstones and compares it
// with the counts the state row keeps: live messages and bytes, a first sequence that names a
// live message (or last + 1), and every sequence in between accounted for by a row or a
// tombstone.
func (db *DB) CheckHoldings(ctx context.Context, id int64) error {
	return db.background(ctx, func(ctx context.Context, q querier) error {
		var first, last, msgs, bytes uint64
		if err := q.QueryRow(ctx, `SELECT first_seq, last_seq, msgs, bytes FROM jetgres.stream_state WHERE stream_id = $1`,
			id).Scan(&first, &last, &msgs, &bytes); err != nil {
			return err
		}
		rows, err := q.Query(ctx, `SELECT chunk_table FROM jetgres.live_chunks($1, $2)`, id, int64(first))
		if err != nil {
			return err
		}
		var tables []string
		for rows.Next() {
			var t string
			if err := rows.Scan(&t); err != nil {
				return err
			}
			tables = append(tables, t)
		}
		rows.Close()
		var memory bool
		if err := q.QueryRow(ctx, `SELECT memory FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&memory); err != nil {
			return err
		}
		var live, liveBytes, present uint64
		for _, t := range tables {
			var n, b, p uint64
			err := q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq)),
					coalesce(sum(`+sqlSize(memory)+`) FILTER (WHERE NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq)), 0),
					count(*) FILTER (WHERE EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq))
				FROM jetgres.`+t+` m WHERE m.seq BETWEEN $2 AND $3`, id, int64(first), int64(last)).Scan(&n, &b, &p)
			if err != nil {
				return err
			}
			live, liveBytes, present = live+n, liveBytes+b, present+p
		}
		var tombs uint64
		if err := q.QueryRow(ctx, `SELECT count(*) FROM jetgres.deleted WHERE stream_id = $1 AND seq BETWEEN $2 AND $3`,
			id, int64(first), int64(last)).Scan(&tombs); err != nil {
			return err
		}
		switch {
		case live != msgs || liveBytes != bytes:
			return fmt.Errorf("state says %d messages, %d bytes; rows hold %d, %d (first %d last %d)", msgs, bytes, live, liveBytes, first, last)
		case first <= last && live+tombs != last-first+1:
			return fmt.Errorf("sequences %d..%d: %d live rows and %d tombstones (%d on rows) do not cover them", first, last, live, tombs, present)
		case msgs == 0 && first != last+1:
			return fmt.Errorf("empty stream with first %d, last %d", first, last)
		}
		if msgs > 0 {
			m, err := db.messageAt(ctx, q, id, first, first)
			if err != nil {
				return err
			}
			if m == nil {
				return fmt.Errorf("first sequence %d holds no live message", first)
			}
		}
		return nil
	})
}
