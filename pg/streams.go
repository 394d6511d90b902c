package pg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrNotFound is returned when a stream, consumer or message does not exist.
	ErrNotFound = errors.New("pg: not found")
	// ErrExists is returned when creating a stream or consumer whose name is taken.
	ErrExists = errors.New("pg: already exists")
)

// Stream is a stream's stored identity and configuration. Config is the JSON the bridge
// stores; pg does not interpret it.
type Stream struct {
	ID      int64
	Name    string
	Config  []byte
	Created time.Time
}

// StreamState is a stream's sequence and size accounting as committed.
type StreamState struct {
	FirstSeq uint64 // logical first sequence; FirstSeq > LastSeq when empty
	LastSeq  uint64
	FirstTS  int64 // unix ns of FirstSeq's message, 0 when empty
	LastTS   int64 // unix ns of LastSeq's message
	Msgs     uint64
	Bytes    uint64
	Deleted  uint64 // tombstoned sequences between FirstSeq and LastSeq
}

const sqlCreateStream = `
WITH s AS (
    INSERT INTO jetgres.streams (name, config) VALUES ($1, $2)
    RETURNING id, created
), st AS (
    INSERT INTO jetgres.stream_state (stream_id) SELECT id FROM s
)
SELECT id, created FROM s`

// CreateStream stores a new stream and creates its first chunk table.
// It returns ErrExists when the name is taken.
func (db *DB) CreateStream(ctx context.Context, name string, config []byte) (Stream, error) {
	st := Stream{Name: name, Config: config}
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		tx, err := q.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		if err := tx.QueryRow(ctx, sqlCreateStream, name, config).Scan(&st.ID, &st.Created); err != nil {
			return err
		}
		if err := createChunk(ctx, tx, st.ID, 0, 1); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return Stream{}, ErrExists
	}
	if err != nil {
		return Stream{}, fmt.Errorf("pg: create stream: %w", err)
	}
	return st, nil
}

// UpdateStreamConfig replaces a stream's stored configuration.
func (db *DB) UpdateStreamConfig(ctx context.Context, id int64, config []byte) error {
	return db.Background(ctx, func(ctx context.Context, q Querier) error {
		tag, err := q.Exec(ctx, `UPDATE jetgres.streams SET config = $2, updated = now() WHERE id = $1`, id, config)
		if err != nil {
			return fmt.Errorf("pg: update stream: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return nil
	})
}

// DeleteStream removes a stream, its consumers, its de-duplication ids and every chunk
// table, in one transaction.
func (db *DB) DeleteStream(ctx context.Context, id int64) error {
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		tx, err := q.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		rows, err := tx.Query(ctx, `SELECT chunk FROM jetgres.chunks WHERE stream_id = $1`, id)
		if err != nil {
			return err
		}
		chunks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM jetgres.streams WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		for _, c := range chunks {
			if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+chunkTable(id, c)); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	})
	if err == nil {
		db.chunks.forget(id)
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("pg: delete stream: %w", err)
	}
	return err
}

// Streams lists every stream, ordered by name.
func (db *DB) Streams(ctx context.Context) ([]Stream, error) {
	var out []Stream
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		rows, err := q.Query(ctx, `SELECT id, name, config, created FROM jetgres.streams ORDER BY name`)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stream, error) {
			var s Stream
			err := r.Scan(&s.ID, &s.Name, &s.Config, &s.Created)
			return s, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: list streams: %w", err)
	}
	return out, nil
}

const sqlStreamState = `
SELECT first_seq, last_seq, last_ts, cum_bytes FROM jetgres.stream_state WHERE stream_id = $1`

// State reads a stream's committed state: sequences, timestamps, message and byte counts.
func (db *DB) State(ctx context.Context, id int64) (StreamState, error) {
	var st StreamState
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		var cum uint64
		if err := q.QueryRow(ctx, sqlStreamState, id).Scan(&st.FirstSeq, &st.LastSeq, &st.LastTS, &cum); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if st.FirstSeq > st.LastSeq {
			return nil
		}
		st.Msgs = st.LastSeq - st.FirstSeq + 1
		first, err := db.messageAt(ctx, q, id, st.FirstSeq, st.LastSeq)
		if err != nil {
			return err
		}
		if first == nil {
			return nil
		}
		st.FirstSeq, st.FirstTS = first.Seq, first.TS
		var gone, goneBytes uint64
		if err := q.QueryRow(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM jetgres.deleted
			WHERE stream_id = $1 AND seq BETWEEN $2 AND $3`, id, int64(st.FirstSeq), int64(st.LastSeq)).Scan(&gone, &goneBytes); err != nil {
			return err
		}
		st.Msgs = st.LastSeq - st.FirstSeq + 1 - gone
		st.Bytes = cum - first.cumBefore - goneBytes
		st.Deleted = gone
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return st, fmt.Errorf("pg: stream state: %w", err)
	}
	return st, err
}

// PurgeParams selects what a purge removes; the zero value removes everything.
type PurgeParams struct {
	Filter string // only messages whose subject matches (wildcards allowed)
	UpTo   uint64 // only sequences below this one
	Keep   uint64 // keep this many of the newest (matching) messages
}

// Purge removes messages from a stream. Without a filter it moves the stream's first
// sequence (reads skip what is below it, the maintainer drops whole chunks later); with a
// filter it leaves tombstones. No message row is updated or deleted. It returns how many
// live messages were removed.
func (db *DB) Purge(ctx context.Context, id int64, p PurgeParams) (purged uint64, err error) {
	err = db.Background(ctx, func(ctx context.Context, q Querier) error {
		tx, err := q.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		var first, last uint64
		err = tx.QueryRow(ctx, `SELECT first_seq, last_seq FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, id).Scan(&first, &last)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		end := last // inclusive end of the purged range
		if p.UpTo > 0 {
			end = min(end, p.UpTo-1)
		}
		if p.Filter == "" || p.Filter == ">" {
			if p.Keep > 0 {
				if last < p.Keep {
					return tx.Commit(ctx)
				}
				end = min(end, last-p.Keep)
			}
			if end < first {
				return tx.Commit(ctx)
			}
			var gone uint64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM jetgres.deleted WHERE stream_id = $1 AND seq BETWEEN $2 AND $3`,
				id, int64(first), int64(end)).Scan(&gone); err != nil {
				return err
			}
			purged = end - first + 1 - gone
			if err := db.moveFirst(ctx, tx, id, end+1, last); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
		// A filtered purge tombstones each matching message, keeping the newest p.Keep.
		chunks, err := db.chunks.list(ctx, tx, id, last)
		if err != nil {
			return err
		}
		for _, c := range chunks {
			tag, err := tx.Exec(ctx, `INSERT INTO jetgres.deleted (stream_id, seq, size)
				SELECT $1, seq, octet_length(subject) + coalesce(octet_length(hdr), 0) + octet_length(data) + 16
				FROM `+chunkTable(id, c.chunk)+` m
				WHERE seq BETWEEN $2 AND $3 AND subject ~ $4
				AND NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq)
				AND ($5 = 0 OR seq NOT IN (SELECT seq FROM (
					SELECT seq FROM `+chunkTable(id, c.chunk)+` k WHERE subject ~ $4
					AND NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = k.seq)
					ORDER BY seq DESC LIMIT $5) newest))`,
				id, int64(first), int64(end), SubjectRegexp(p.Filter), int64(p.Keep))
			if err != nil && !isUndefinedTable(err) {
				return err
			}
			purged += uint64(tag.RowsAffected())
		}
		if err := db.moveFirst(ctx, tx, id, first, last); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, fmt.Errorf("pg: purge stream: %w", err)
	}
	return purged, err
}

// moveFirst sets the stream's first sequence to the first live message at or after from.
func (db *DB) moveFirst(ctx context.Context, q Querier, id int64, from, last uint64) error {
	next := last + 1
	if from <= last {
		m, err := db.messageAt(ctx, q, id, from, last)
		if err != nil {
			return err
		}
		if m != nil {
			next = m.Seq
		}
	}
	_, err := q.Exec(ctx, `UPDATE jetgres.stream_state SET first_seq = $2 WHERE stream_id = $1 AND first_seq < $2`, id, int64(next))
	return err
}

// DeleteMessage removes one message by leaving a tombstone that reads skip. Deleting the
// first message moves the stream's first sequence instead. It returns ErrNotFound when the
// sequence holds no live message.
func (db *DB) DeleteMessage(ctx context.Context, id int64, seq uint64) error {
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		tx, err := q.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		var first, last uint64
		err = tx.QueryRow(ctx, `SELECT first_seq, last_seq FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, id).Scan(&first, &last)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if seq < first || seq > last {
			return ErrNotFound
		}
		m, err := db.messageAt(ctx, tx, id, seq, seq)
		if err != nil {
			return err
		}
		if m == nil {
			return ErrNotFound
		}
		if _, err := tx.Exec(ctx, `INSERT INTO jetgres.deleted (stream_id, seq, size) VALUES ($1, $2, $3)`, id, int64(seq), int64(m.Size())); err != nil {
			return err
		}
		if seq == first {
			if err := db.moveFirst(ctx, tx, id, seq+1, last); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("pg: delete message: %w", err)
	}
	return err
}
