package pg

import (
	"context"
	"fmt"

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

// GetMessage returns the message with sequence seq, or ErrNotFound.
func (db *DB) GetMessage(ctx context.Context, streamID int64, seq uint64) (*Message, error) {
	var m *Message
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		first, last, err := streamBounds(ctx, q, streamID)
		if err != nil {
			return err
		}
		if seq < first || seq > last {
			return nil
		}
		m, err = db.messageAt(ctx, q, streamID, seq, seq)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: get message: %w", err)
	}
	if m == nil || m.Seq != seq {
		return nil, ErrNotFound
	}
	return m, nil
}

// LastBySubject returns the newest message whose subject matches filter, or ErrNotFound.
func (db *DB) LastBySubject(ctx context.Context, streamID int64, filter string) (*Message, error) {
	var m *Message
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		first, last, err := streamBounds(ctx, q, streamID)
		if err != nil {
			return err
		}
		m, err = db.lastMatching(ctx, q, streamID, filter, first, last)
		return err
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
		rows, err := q.Query(ctx, `SELECT seq, ts, subject, hdr, data, cum_before FROM `+chunkTable(streamID, chunks[i].chunk)+
			` m WHERE `+cond+` AND seq >= $2 AND seq <= $3 AND `+notTombstoned("$4")+`
			ORDER BY seq DESC LIMIT 1`, arg, int64(first), int64(upTo), streamID)
		if err != nil {
			if isUndefinedTable(err) {
				return nil, nil
			}
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
