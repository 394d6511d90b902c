package pg

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ReadHeaders reads the live messages of [p.From, p.UpTo] without their data: sequence,
// time, subject and header, for a reader that decides from headers alone (the message
// scheduler's scan, bridge/schedule), and the sequence through which it looked. It looks
// through at most p.MaxMsgs sequences, so that however PostgreSQL plans the statement, it
// touches no more rows than that (read.go's windows, for the same reason). It runs off the
// hot path, under the background timeout; p's byte bounds do not apply.
func (db *DB) ReadHeaders(ctx context.Context, p ReadParams) (out []Message, through uint64, err error) {
	if p.MaxMsgs <= 0 || p.From > p.UpTo {
		return nil, p.From - 1, nil
	}
	through = min(p.UpTo, p.From+uint64(p.MaxMsgs)-1)
	err = db.background(ctx, func(ctx context.Context, q querier) error {
		chunks, err := db.chunks.list(ctx, q, p.StreamID, through)
		if err != nil {
			return err
		}
		var in []int64
		for i, c := range chunks {
			if c.firstSeq <= through && (i+1 == len(chunks) || chunks[i+1].firstSeq > p.From) {
				in = append(in, c.chunk)
			}
		}
		rows, err := q.Query(ctx, `SELECT seq, ts, subject, hdr FROM jetgres.msgs m
			WHERE m.stream_id = $1 AND m.chunk = ANY($2) AND m.seq >= $3 AND m.seq <= $4 AND `+liveRows+`
			ORDER BY m.seq`, p.StreamID, in, int64(p.From), int64(through))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Message, error) {
			var m Message
			var seq int64
			err := r.Scan(&seq, &m.TS, &m.Subject, &m.Header)
			m.Seq = uint64(seq)
			return m, err
		})
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("pg: read headers: %w", err)
	}
	return out, through, nil
}
