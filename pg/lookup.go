package pg

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

func scanMessage(r pgx.CollectableRow) (Message, error) {
	var m Message
	var seq, cum int64
	err := r.Scan(&seq, &m.TS, &m.Subject, &m.Header, &m.Data, &cum)
	m.Seq, m.cumBefore = uint64(seq), uint64(cum)
	return m, err
}

// streamBounds reads a stream's committed first and last sequence.
func streamBounds(ctx context.Context, q querier, streamID int64) (first, last uint64, err error) {
	err = q.QueryRow(ctx, `SELECT first_seq, last_seq FROM jetgres.stream_state WHERE stream_id = $1`, streamID).Scan(&first, &last)
	return first, last, err
}

// GetMessage returns the message with sequence seq, or ErrNotFound. It is one statement: the
// chunk list is cached, and the stream's bounds are read in the same query as the row.
func (db *DB) GetMessage(ctx context.Context, streamID int64, seq uint64) (*Message, error) {
	var m *Message
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		chunks, err := db.chunks.list(ctx, q, streamID, seq)
		if err != nil {
			return err
		}
		k := sort.Search(len(chunks), func(i int) bool { return chunks[i].firstSeq > seq }) - 1
		if k < 0 {
			return nil
		}
		rows, err := q.Query(ctx, `SELECT m.seq, m.ts, m.subject, m.hdr, m.data, m.cum_before FROM jetgres.msgs m, jetgres.stream_state st
			WHERE st.stream_id = $2 AND m.stream_id = $2 AND m.chunk = $3 AND m.seq = $1 AND m.seq >= st.first_seq AND m.seq <= st.last_seq
				AND `+notTombstoned("$2"),
			customPlan, int64(seq), streamID, chunks[k].chunk)
		if err != nil {
			return err
		}
		msgs, err := pgx.CollectRows(rows, scanMessage)
		if len(msgs) > 0 {
			m = &msgs[0]
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: get message: %w", err)
	}
	if m == nil {
		return nil, ErrNotFound
	}
	return m, nil
}

// LastBySubject returns the newest message whose subject matches filter, or ErrNotFound. It
// looks through the chunks newest first, one statement each that reads the stream's bounds
// too: the newest chunk answers a subject written lately in one round trip.
func (db *DB) LastBySubject(ctx context.Context, streamID int64, filter string) (*Message, error) {
	var m *Message
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		// The cached chunk list first; the stream's last sequence, read with the newest
		// chunk, tells whether another replica opened chunks since.
		chunks, err := db.chunks.list(ctx, q, streamID, 0)
		if err != nil {
			return err
		}
		cond, arg := subjectMatch(filter, 1)
		for i := len(chunks) - 1; i >= 0; i-- {
			var first, last int64
			var seq *int64
			var found Message
			var cum int64
			err := q.QueryRow(ctx, `SELECT st.first_seq, st.last_seq, m.seq, COALESCE(m.ts, 0), COALESCE(m.subject, ''), m.hdr, m.data, COALESCE(m.cum_before, 0)
				FROM jetgres.stream_state st LEFT JOIN LATERAL (SELECT seq, ts, subject, hdr, data, cum_before FROM jetgres.msgs m
				WHERE m.stream_id = $2 AND m.chunk = $3 AND `+cond+` AND seq >= st.first_seq AND seq <= st.last_seq AND `+notTombstoned("$2")+`
				ORDER BY seq DESC LIMIT 1) m ON true WHERE st.stream_id = $2`, customPlan, arg, streamID, chunks[i].chunk).
				Scan(&first, &last, &seq, &found.TS, &found.Subject, &found.Header, &found.Data, &cum)
			if err != nil {
				return err
			}
			if i == len(chunks)-1 {
				newer, err := db.chunks.list(ctx, q, streamID, uint64(last))
				if err != nil {
					return err
				}
				if len(newer) > 0 && newer[len(newer)-1].chunk != chunks[i].chunk {
					chunks, i = newer, len(newer)
					continue
				}
			}
			if seq != nil {
				found.Seq, found.cumBefore = uint64(*seq), uint64(cum)
				m = &found
				return nil
			}
			if chunks[i].firstSeq <= uint64(first) {
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pg: last by subject: %w", err)
	}
	if m == nil {
		return nil, ErrNotFound
	}
	return m, nil
}

// NextBySubject returns the first live message at or after from whose subject matches
// filter, or ErrNotFound.
func (db *DB) NextBySubject(ctx context.Context, streamID int64, filter string, from uint64) (*Message, error) {
	var msgs []Message
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		first, last, err := streamBounds(ctx, q, streamID)
		if err != nil {
			return err
		}
		msgs, _, err = db.readRange(ctx, q, ReadParams{StreamID: streamID, From: max(from, first), UpTo: last, MaxMsgs: 1}, []string{filter})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: next by subject: %w", err)
	}
	if len(msgs) == 0 {
		return nil, ErrNotFound
	}
	return &msgs[0], nil
}

// messageAt returns the first live message with sequence in [from, upTo], or nil.
func (db *DB) messageAt(ctx context.Context, q querier, streamID int64, from, upTo uint64) (*Message, error) {
	msgs, _, err := db.readRange(ctx, q, ReadParams{StreamID: streamID, From: from, UpTo: upTo, MaxMsgs: 1}, nil)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	return &msgs[0], nil
}

// lastMatching scans chunks newest first for the last live message in [first, upTo]
// matching filter.
func (db *DB) lastMatching(ctx context.Context, q querier, streamID int64, filter string, first, upTo uint64) (*Message, error) {
	chunks, err := db.chunks.list(ctx, q, streamID, upTo)
	if err != nil {
		return nil, err
	}
	cond, arg := subjectMatch(filter, 1)
	for i := len(chunks) - 1; i >= 0; i-- {
		rows, err := q.Query(ctx, `SELECT seq, ts, subject, hdr, data, cum_before FROM jetgres.msgs m
			WHERE m.stream_id = $4 AND m.chunk = $5 AND `+cond+` AND seq >= $2 AND seq <= $3 AND `+notTombstoned("$4")+`
			ORDER BY seq DESC LIMIT 1`, customPlan, arg, int64(first), int64(upTo), streamID, chunks[i].chunk)
		if err != nil {
			return nil, err
		}
		msgs, err := pgx.CollectRows(rows, scanMessage)
		if err != nil {
			return nil, err
		}
		if len(msgs) > 0 {
			return &msgs[0], nil
		}
		if chunks[i].firstSeq <= first {
			break
		}
	}
	return nil, nil
}
