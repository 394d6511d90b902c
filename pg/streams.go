package pg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	// ErrNotFound is returned when a stream, consumer or message does not exist.
	ErrNotFound = errors.New("pg: not found")
	// ErrExists is returned when creating a stream or consumer whose name is taken.
	ErrExists = errors.New("pg: already exists")
	// ErrPastLast is the ErrNotFound of a message delete beyond the stream's last sequence,
	// which JetStream answers differently from a gap.
	ErrPastLast = fmt.Errorf("%w: past the last sequence", ErrNotFound)
)

// StreamRow is a stream's stored identity and configuration. Config is the JSON the bridge
// stores; pg does not interpret it.
type StreamRow struct {
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
	// Purged says that a purge emptied the stream before it held any message, which
	// JetStream reports with first_seq 1 rather than 0.
	Purged bool
}

const sqlCreateStream = `
WITH s AS (
    INSERT INTO jetgres.streams (name, config) VALUES ($1, $2)
    RETURNING id, created, config
), st AS (
    INSERT INTO jetgres.stream_state (stream_id, first_seq, last_seq, memory)
    SELECT id, $3::bigint, $3::bigint - 1, coalesce(config->>'storage' = 'memory', false) FROM s
)
SELECT id, created, coalesce(config->>'storage' = 'memory', false) FROM s`

// CreateStream stores a new stream and creates its first chunk table.
// It returns ErrExists when the name is taken.
func (db *DB) CreateStream(ctx context.Context, name string, config []byte) (StreamRow, error) {
	return db.CreateStreamFrom(ctx, name, config, 0)
}

// CreateStreamFrom is CreateStream for a stream whose first message takes sequence
// firstSeq (JetStream's first_seq; 0 is 1), as though a purge had moved it there: JetStream
// reports any first_seq given, 1 too, as purged (StreamState.Purged). It returns ErrSeqRange
// when firstSeq is above MaxSeq.
func (db *DB) CreateStreamFrom(ctx context.Context, name string, config []byte, firstSeq uint64) (StreamRow, error) {
	return db.CreateStreamChecked(ctx, name, config, firstSeq, nil)
}

// CreateStreamChecked is CreateStreamFrom that stores the stream only when check, run in
// the same transaction under a lock that serialises stream creation across replicas,
// accepts the streams stored already. check's error is returned as it is.
func (db *DB) CreateStreamChecked(ctx context.Context, name string, config []byte, firstSeq uint64, check StreamCheck) (StreamRow, error) {
	if firstSeq > MaxSeq {
		return StreamRow{}, fmt.Errorf("pg: create stream from %d: %w", firstSeq, ErrSeqRange)
	}
	purged := firstSeq > 0
	firstSeq = max(firstSeq, 1)
	st := StreamRow{Name: name, Config: config}
	var memory bool
	var checkErr error
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		if err := runStreamCheck(ctx, q, name, check, &checkErr); err != nil {
			return err
		}
		if err := q.QueryRow(ctx, sqlCreateStream, name, config, int64(firstSeq)).Scan(&st.ID, &st.Created, &memory); err != nil {
			return err
		}
		if purged {
			if err := markPurged(ctx, q, st.ID); err != nil {
				return err
			}
		}
		if err := createChunk(ctx, q, st.ID, 0, firstSeq); err != nil {
			return err
		}
		return notifyMeta(ctx, q, st.ID)
	})
	if checkErr != nil {
		return StreamRow{}, checkErr
	}
	if hasSQLState(err, "23505") {
		return StreamRow{}, ErrExists
	}
	if err != nil {
		return StreamRow{}, fmt.Errorf("pg: create stream: %w", err)
	}
	// The state row is as sqlCreateStream made it, so the stream's first publish can take
	// the fast path rather than lock the row to learn what this process just wrote.
	db.tails.seed(st.ID, tailState{firstSeq: firstSeq, lastSeq: firstSeq - 1, memory: memory})
	return st, nil
}

// UpdateStreamConfig replaces a stream's stored configuration.
func (db *DB) UpdateStreamConfig(ctx context.Context, id int64, config []byte) error {
	return db.UpdateStreamChecked(ctx, id, "", config, nil)
}

// execOne runs a background statement that must touch exactly one row: ErrNotFound when it
// touched none, other errors wrapped with what failed.
func (db *DB) execOne(ctx context.Context, what, sql string, args ...any) error {
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		tag, err := q.Exec(ctx, sql, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("pg: %s: %w", what, err)
	}
	return err
}

// DeleteStream removes a stream, its consumers and its de-duplication ids in one
// transaction, and then drops its chunk tables; a table it cannot drop at once (see
// dropChunkTable) is left to ReapChunks, and holds nothing any reader can reach.
func (db *DB) DeleteStream(ctx context.Context, id int64) error {
	var gone []int64
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT chunk FROM jetgres.chunks WHERE stream_id = $1`, id)
		if err != nil {
			return err
		}
		chunks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		rows, err = q.Query(ctx, `SELECT bucket FROM jetgres.id_buckets WHERE stream_id = $1`, id)
		if err != nil {
			return err
		}
		buckets, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		tag, err := q.Exec(ctx, `DELETE FROM jetgres.streams WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		gone = chunks
		for _, b := range buckets {
			if _, err := q.Exec(ctx, `DROP TABLE IF EXISTS `+idBucketTable(id, b)); err != nil {
				return err
			}
		}
		return notifyMeta(ctx, q, id)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("pg: delete stream: %w", err)
	}
	if err != nil {
		return err
	}
	db.chunks.forget(id)
	db.tails.forget(id)
	db.subjects.forget(id)
	db.lasts.forget(id)
	db.counts.forget(id)
	for _, c := range gone {
		if ok, err := db.dropChunkTable(ctx, chunkName(id, c), true); err != nil || !ok {
			break
		}
	}
	return nil
}

// StreamNamed reports whether a stream called name is stored: one read by the name's
// unique index, for a lookup that must not mistake a stream another replica created for
// an unknown one.
func (db *DB) StreamNamed(ctx context.Context, name string) (bool, error) {
	var found bool
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetgres.streams WHERE name = $1)`, name).Scan(&found)
	})
	if err != nil {
		return false, fmt.Errorf("pg: look up stream: %w", err)
	}
	return found, nil
}

// Streams lists every stream, ordered by name.
//
// It reads each stream's state row too, and remembers it for a stream this process has not
// appended to yet: after a start the first publish of every stream then takes the fast path,
// whose guard sends it the general way if the row has moved since, instead of locking the
// row to learn it. A read of the row is as good a starting point as a commit of this
// process's own: while the last sequence and chunk are as read, the counts can only have
// fallen, which the fast path allows for.
func (db *DB) Streams(ctx context.Context) ([]StreamRow, error) {
	var out []StreamRow
	var tails []tailState
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT s.id, s.name, s.config, s.created, st.first_seq, st.last_seq, st.last_ts,
				st.cum_bytes, st.msgs, st.bytes, st.chunk, st.chunk_rows, st.memory
			FROM jetgres.streams s JOIN jetgres.stream_state st ON st.stream_id = s.id ORDER BY s.name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		out, tails = out[:0], tails[:0]
		for rows.Next() {
			var s StreamRow
			var t tailState
			if err := rows.Scan(&s.ID, &s.Name, &s.Config, &s.Created, &t.firstSeq, &t.lastSeq, &t.lastTS,
				&t.cumBytes, &t.msgs, &t.bytes, &t.chunk, &t.chunkRows, &t.memory); err != nil {
				return err
			}
			out, tails = append(out, s), append(tails, t)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("pg: list streams: %w", err)
	}
	for i, st := range out {
		db.tails.seed(st.ID, tails[i])
	}
	return out, nil
}

const sqlStreamState = `
SELECT first_seq, last_seq, last_ts, msgs, bytes, purged FROM jetgres.stream_state WHERE stream_id = $1`

// State reads a stream's committed state: sequences, timestamps, message and byte counts.
// It reads in one snapshot, so that the counts and the first message agree.
func (db *DB) State(ctx context.Context, id int64) (StreamState, error) {
	var st StreamState
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		st = StreamState{}
		if _, err := q.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
			return err
		}
		if err := q.QueryRow(ctx, sqlStreamState, id).Scan(&st.FirstSeq, &st.LastSeq, &st.LastTS, &st.Msgs, &st.Bytes, &st.Purged); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if st.Msgs == 0 {
			return nil
		}
		first, err := db.messageAt(ctx, q, id, st.FirstSeq, st.LastSeq)
		if err != nil || first == nil {
			return err
		}
		st.FirstSeq, st.FirstTS = first.Seq, first.TS
		st.Deleted = st.LastSeq - st.FirstSeq + 1 - st.Msgs
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

// Purge removes messages from a stream, as JetStream's purge request does. Without a filter
// it moves the stream's first sequence (reads skip what is below it, the maintainer drops
// whole chunks later); with a filter it leaves tombstones. No message row is updated or
// deleted. It returns how many live messages were removed, or ErrSeqRange when UpTo is
// above MaxSeq.
func (db *DB) Purge(ctx context.Context, id int64, p PurgeParams) (purged uint64, err error) {
	if p.UpTo > MaxSeq {
		return 0, fmt.Errorf("pg: purge up to %d: %w", p.UpTo, ErrSeqRange)
	}
	err = db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		st, err := lockState(ctx, q, id)
		if err != nil {
			return err
		}
		before := st.msgs
		if err := db.purge(ctx, q, st, p); err != nil {
			return err
		}
		purged = before - st.msgs
		return st.save(ctx, q)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, fmt.Errorf("pg: purge stream: %w", err)
	}
	return purged, err
}

func (db *DB) purge(ctx context.Context, q querier, st *stateRow, p PurgeParams) error {
	if p.UpTo == 1 {
		// Up to, but not including, the first sequence there can be.
		return nil
	}
	all := p.Filter == "" || p.Filter == ">"
	if all && p.Keep == 0 {
		switch {
		case p.UpTo == 0:
			if st.last == 0 {
				return markPurged(ctx, q, st.id)
			}
			_, err := db.advanceFirst(ctx, q, st, st.last+1)
			return err
		case p.UpTo > st.last+1:
			// JetStream compacts past the end by restarting the stream there: the next
			// message stored takes sequence UpTo.
			if _, err := db.advanceFirst(ctx, q, st, st.last+1); err != nil {
				return err
			}
			st.first, st.last = p.UpTo, p.UpTo-1
			return nil
		default:
			_, err := db.advanceFirst(ctx, q, st, p.UpTo)
			return err
		}
	}
	end := st.last
	if p.UpTo > 0 {
		end = min(end, p.UpTo-1)
	}
	cond, arg := subjectMatch(p.Filter, 4)
	if p.Keep > 0 {
		kept, ok, err := db.newestNth(ctx, q, st, cond, arg, p.Keep)
		if err != nil || !ok {
			return err
		}
		end = min(end, kept-1)
	}
	if end < st.first {
		return nil
	}
	if all {
		_, err := db.advanceFirst(ctx, q, st, end+1)
		return err
	}
	if _, err := db.tombstoneWhere(ctx, q, st, st.first, end, cond, arg); err != nil {
		return err
	}
	return db.settleFirst(ctx, q, st)
}

// sqlMarkPurged marks a stream that never held a message as purged, for StreamState.Purged.
const sqlMarkPurged = `UPDATE jetgres.stream_state SET purged = true WHERE stream_id = $1 AND last_seq = 0 AND NOT purged`

func markPurged(ctx context.Context, q querier, id int64) error {
	if _, err := q.Exec(ctx, sqlMarkPurged, id); err != nil {
		return fmt.Errorf("mark stream %d purged: %w", id, err)
	}
	return nil
}

// InterestGone marks an interest stream whose last consumer went as JetStream marks it: it
// purges the stream then, which before any message moves its first sequence to 1. Messages
// the stream holds are retention's; this only matters, and only acts, while it never held
// one and no consumer is left.
func (db *DB) InterestGone(ctx context.Context, id int64) error {
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		_, err := q.Exec(ctx, sqlMarkPurged+` AND NOT EXISTS (SELECT 1 FROM jetgres.consumers c WHERE c.stream_id = $1)`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("pg: mark stream purged: %w", err)
	}
	return nil
}

// newestNth returns the sequence of the n-th newest live message that cond (built by
// subjectMatch for placeholder $4) selects; ok is false when there are fewer than n.
func (db *DB) newestNth(ctx context.Context, q querier, st *stateRow, cond string, arg any, n uint64) (seq uint64, ok bool, err error) {
	if st.msgs < n {
		return 0, false, nil
	}
	if arg == nil && st.msgs == st.last-st.first+1 {
		return st.last - n + 1, true, nil
	}
	chunks, err := db.chunks.list(ctx, q, st.id, st.last)
	if err != nil {
		return 0, false, err
	}
	live := liveChunks(chunks, st.first, st.last)
	for i := len(live) - 1; i >= 0; i-- {
		table := chunkTable(st.id, live[i].chunk)
		var found *int64
		var count uint64
		err := q.QueryRow(ctx, `WITH sel AS (
				SELECT m.seq FROM `+table+` m WHERE m.seq BETWEEN $2 AND $3 AND `+sqlLive+` AND `+cond+`)
			SELECT (SELECT count(*) FROM sel), (SELECT seq FROM sel ORDER BY seq DESC OFFSET $5 LIMIT 1)`,
			st.id, int64(st.first), int64(st.last), arg, int64(n-1)).Scan(&count, &found)
		if err != nil {
			return 0, false, fmt.Errorf("find the newest messages of stream %d: %w", st.id, err)
		}
		if found != nil {
			return uint64(*found), true, nil
		}
		n -= count
	}
	return 0, false, nil
}

// DeleteMessage removes one message by leaving a tombstone that reads skip. Deleting the
// first message moves the stream's first sequence instead. It returns ErrNotFound when the
// sequence holds no live message, ErrPastLast when it is beyond the last.
func (db *DB) DeleteMessage(ctx context.Context, id int64, seq uint64) error {
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		st, err := lockState(ctx, q, id)
		if err != nil {
			return err
		}
		switch {
		case seq > st.last:
			return ErrPastLast
		case seq < st.first:
			return ErrNotFound
		}
		if seq == st.first {
			if _, err := db.advanceFirst(ctx, q, st, seq+1); err != nil {
				return err
			}
			return st.save(ctx, q)
		}
		n, err := db.tombstoneWhere(ctx, q, st, seq, seq, `true`)
		if err != nil {
			return err
		}
		if n == 0 {
			return ErrNotFound
		}
		return st.save(ctx, q)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("pg: delete message: %w", err)
	}
	return err
}

// GoneSeqs returns those of seqs that hold no live message: below the stream's first
// sequence, past its last, or tombstoned.
func (db *DB) GoneSeqs(ctx context.Context, id int64, seqs []uint64) ([]uint64, error) {
	arg := make([]int64, len(seqs))
	for i, s := range seqs {
		arg[i] = int64(s)
	}
	var out []uint64
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		rows, err := q.Query(ctx, `SELECT s.seq FROM unnest($2::bigint[]) AS s(seq), jetgres.stream_state st
			WHERE st.stream_id = $1 AND (s.seq < st.first_seq OR s.seq > st.last_seq
				OR EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = s.seq))
			ORDER BY s.seq`, id, arg)
		if err != nil {
			return err
		}
		out, err = collectSeqs(rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pg: gone sequences: %w", err)
	}
	return out, nil
}
