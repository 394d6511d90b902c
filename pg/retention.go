package pg

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// stateRow is a stream's state row as a transaction that changes what the stream holds reads
// it, under the row's lock. Between lockState and save, the transaction keeps first, msgs and
// bytes right as it moves the first sequence and leaves tombstones.
type stateRow struct {
	id       int64
	first    uint64
	last     uint64
	cumBytes uint64
	msgs     uint64
	bytes    uint64
	memory   bool // sizes count as a memory stream's (see MessageSize)
}

func lockState(ctx context.Context, q querier, id int64) (*stateRow, error) {
	st := &stateRow{id: id}
	err := q.QueryRow(ctx, `SELECT first_seq, last_seq, cum_bytes, msgs, bytes, memory FROM jetgres.stream_state
		WHERE stream_id = $1 FOR UPDATE`, id).Scan(&st.first, &st.last, &st.cumBytes, &st.msgs, &st.bytes, &st.memory)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("lock state of stream %d: %w", id, err)
	}
	return st, nil
}

func (st *stateRow) save(ctx context.Context, q querier) error {
	_, err := q.Exec(ctx, `UPDATE jetgres.stream_state SET first_seq = $2, last_seq = $3, msgs = $4, bytes = $5
		WHERE stream_id = $1`, st.id, int64(st.first), int64(st.last), int64(st.msgs), int64(st.bytes))
	if err != nil {
		return fmt.Errorf("update state of stream %d: %w", st.id, err)
	}
	return nil
}

// advanceFirst moves the stream's first sequence to the first live message at or after target
// (last + 1 when there is none) and takes what it passed out of the counts. It reads the two
// cumulative byte counts at either end and the tombstones in between, never the rows in
// between, so its cost does not grow with the range removed. It returns how many live
// messages it removed.
func (db *DB) advanceFirst(ctx context.Context, q querier, st *stateRow, target uint64) (uint64, error) {
	if target <= st.first {
		return 0, nil
	}
	if st.msgs == 0 {
		st.first = max(st.first, st.last+1)
		return 0, nil
	}
	next, cumNext := st.last+1, st.cumBytes
	if target <= st.last {
		m, err := db.messageAt(ctx, q, st.id, target, st.last)
		if err != nil {
			return 0, err
		}
		if m != nil {
			next, cumNext = m.Seq, m.cumBefore
		}
	}
	cumFirst, err := db.cumAt(ctx, q, st.id, st.first)
	if err != nil {
		return 0, err
	}
	var gone, goneBytes uint64
	if err := q.QueryRow(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM jetgres.deleted
		WHERE stream_id = $1 AND seq >= $2 AND seq < $3`, st.id, int64(st.first), int64(next)).Scan(&gone, &goneBytes); err != nil {
		return 0, fmt.Errorf("count tombstones of stream %d: %w", st.id, err)
	}
	removed := next - st.first - gone
	st.msgs -= removed
	st.bytes -= cumNext - cumFirst - goneBytes
	st.first = next
	return removed, nil
}

// cumAt is the cumulative byte count before the row at seq, tombstoned or not.
func (db *DB) cumAt(ctx context.Context, q querier, id int64, seq uint64) (uint64, error) {
	chunks, err := db.chunks.list(ctx, q, id, seq)
	if err != nil {
		return 0, err
	}
	var cum uint64
	err = q.QueryRow(ctx, `SELECT cum_before FROM `+chunkTable(id, chunkOf(chunks, seq))+` WHERE seq = $1`, int64(seq)).Scan(&cum)
	if err != nil {
		return 0, fmt.Errorf("stream %d has no row at sequence %d: %w", id, seq, err)
	}
	return cum, nil
}

// chunkOf is the chunk that holds seq: the newest that begins at or before it.
func chunkOf(chunks []chunkInfo, seq uint64) int64 {
	i := sort.Search(len(chunks), func(i int) bool { return chunks[i].firstSeq > seq }) - 1
	if i < 0 {
		return 0
	}
	return chunks[i].chunk
}

// liveChunks is the part of a chunk list that can hold sequences in [from, upTo]. With the
// state row locked and from at or above the first sequence, none of them can be one the
// maintainer drops, so a statement on them cannot fail on a missing table and abort the
// transaction.
func liveChunks(chunks []chunkInfo, from, upTo uint64) []chunkInfo {
	var out []chunkInfo
	for i, c := range chunks {
		if c.firstSeq > upTo {
			break
		}
		if i+1 < len(chunks) && chunks[i+1].firstSeq <= from {
			continue
		}
		out = append(out, c)
	}
	return out
}

// sqlLive is true for a chunk row that no tombstone covers; $1 is the stream id.
const sqlLive = `NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq)`

// tombstoneWhere leaves a tombstone on every live row in [from, upTo] that cond selects, and
// takes them out of the counts. cond is SQL on the chunk row m; its arguments follow $1
// (stream id), $2 and $3 (the range). It returns how many rows it removed.
func (db *DB) tombstoneWhere(ctx context.Context, q querier, st *stateRow, from, upTo uint64, cond string, args ...any) (uint64, error) {
	from = max(from, st.first)
	upTo = min(upTo, st.last)
	if from > upTo || st.msgs == 0 {
		return 0, nil
	}
	chunks, err := db.chunks.list(ctx, q, st.id, upTo)
	if err != nil {
		return 0, err
	}
	var removed uint64
	for _, c := range liveChunks(chunks, from, upTo) {
		var n, size uint64
		err := q.QueryRow(ctx, `WITH gone AS (
				INSERT INTO jetgres.deleted (stream_id, seq, size)
				SELECT $1, m.seq, `+sqlSize(st.memory)+` FROM `+chunkTable(st.id, c.chunk)+` m
				WHERE m.seq BETWEEN $2 AND $3 AND `+sqlLive+` AND (`+cond+`)
				RETURNING size)
			SELECT count(*), coalesce(sum(size), 0) FROM gone`,
			append([]any{st.id, int64(from), int64(upTo)}, args...)...).Scan(&n, &size)
		if err != nil {
			return removed, fmt.Errorf("tombstone messages of stream %d in chunk %d: %w", st.id, c.chunk, err)
		}
		removed += n
		st.msgs -= n
		st.bytes -= size
	}
	return removed, nil
}

// settleFirst moves the first sequence past tombstones that now sit at the front.
func (db *DB) settleFirst(ctx context.Context, q querier, st *stateRow) error {
	if st.msgs == 0 {
		st.first = max(st.first, st.last+1)
		return nil
	}
	var dead bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM jetgres.deleted WHERE stream_id = $1 AND seq = $2)`,
		st.id, int64(st.first)).Scan(&dead); err != nil {
		return fmt.Errorf("check first sequence of stream %d: %w", st.id, err)
	}
	if !dead {
		return nil
	}
	_, err := db.advanceFirst(ctx, q, st, st.first+1)
	return err
}

// frontAged reports whether the first message of a stream was stored at or before cutoff
// (unix ns on PostgreSQL's clock), read without the state row's lock.
func (db *DB) frontAged(ctx context.Context, id int64, cutoff int64) (bool, error) {
	due := false
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		var first, last, msgs uint64
		err := q.QueryRow(ctx, `SELECT first_seq, last_seq, msgs FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&first, &last, &msgs)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil || msgs == 0 {
			return err
		}
		m, err := db.messageAt(ctx, q, id, first, last)
		due = m != nil && m.TS <= cutoff
		return err
	})
	return due, err
}

// ExpireOlder removes a stream's messages stored at or before cutoff (unix ns on the
// replica's clock, moved onto PostgreSQL's as Append moves store times): max_age.
// Timestamps grow with sequences, so this only moves the first sequence. It returns how many
// live messages it removed.
func (db *DB) ExpireOlder(ctx context.Context, id int64, cutoff int64) (uint64, error) {
	cutoff = db.pgUnixNano(cutoff)
	// Most of the time nothing is due: look at the first message without the lock, so that
	// the maintainer's once-a-second check does not queue behind appends.
	due, err := db.frontAged(ctx, id, cutoff)
	if err != nil || !due {
		if err != nil && !errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("pg: expire messages: %w", err)
		}
		return 0, err
	}
	var removed uint64
	err = db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		st, err := lockState(ctx, q, id)
		if err != nil || st.msgs == 0 {
			return err
		}
		target, err := db.ageTarget(ctx, q, st, cutoff)
		if err != nil {
			return err
		}
		if removed, err = db.advanceFirst(ctx, q, st, target); err != nil {
			return err
		}
		return db.saveIf(ctx, q, st, removed)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, fmt.Errorf("pg: expire messages: %w", err)
	}
	return removed, err
}

// EnforceLimits applies limits that were just lowered to what a stream already holds, as
// JetStream does on a configuration update: subjects over max_msgs_per_subject lose their
// oldest messages, and under discard old the oldest messages go until max_msgs and
// max_bytes hold. It returns how many live messages it removed.
func (db *DB) EnforceLimits(ctx context.Context, id int64, lim Limits) (uint64, error) {
	var removed uint64
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		st, err := lockState(ctx, q, id)
		if err != nil || st.msgs == 0 {
			return err
		}
		if lim.MaxMsgsPer > 0 {
			over, err := db.overPerSubject(ctx, q, st, lim.MaxMsgsPer)
			if err != nil {
				return err
			}
			if len(over) > 0 {
				n, err := db.tombstoneWhere(ctx, q, st, uint64(over[0]), uint64(over[len(over)-1]), `m.seq = ANY($4)`, over)
				if err != nil {
					return err
				}
				removed += n
				if err := db.settleFirst(ctx, q, st); err != nil {
					return err
				}
			}
		}
		if lim.DiscardNew {
			return db.saveIf(ctx, q, st, removed)
		}
		if lim.MaxMsgs > 0 && st.msgs > uint64(lim.MaxMsgs) {
			cond, arg := subjectMatch("", 4)
			keep, _, err := db.newestNth(ctx, q, st, cond, arg, uint64(lim.MaxMsgs))
			if err != nil {
				return err
			}
			n, err := db.advanceFirst(ctx, q, st, keep)
			if err != nil {
				return err
			}
			removed += n
		}
		for lim.MaxBytes > 0 && st.bytes > uint64(lim.MaxBytes) {
			head, err := db.fetchHead(ctx, q, id, st.first, headPrefetchMax)
			if err != nil {
				return err
			}
			target, bytes := st.first, st.bytes
			for _, r := range head {
				if bytes <= uint64(lim.MaxBytes) {
					break
				}
				bytes, target = bytes-r.size, r.seq+1
			}
			n, err := db.advanceFirst(ctx, q, st, target)
			if err != nil {
				return err
			}
			removed += n
		}
		return db.saveIf(ctx, q, st, removed)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, fmt.Errorf("pg: enforce limits: %w", err)
	}
	return removed, err
}

// saveIf saves the state row when a transaction removed something.
func (db *DB) saveIf(ctx context.Context, q querier, st *stateRow, removed uint64) error {
	if removed == 0 {
		return nil
	}
	return st.save(ctx, q)
}

// overPerSubject returns, in order, the live messages of a stream that have more than
// perSubject newer live messages of their subject.
func (db *DB) overPerSubject(ctx context.Context, q querier, st *stateRow, perSubject int64) ([]int64, error) {
	chunks, err := db.chunks.list(ctx, q, st.id, st.last)
	if err != nil {
		return nil, err
	}
	var parts []string
	for _, c := range liveChunks(chunks, st.first, st.last) {
		parts = append(parts, `SELECT m.seq, m.subject FROM `+chunkTable(st.id, c.chunk)+` m WHERE m.seq >= $2 AND `+sqlLive)
	}
	if len(parts) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT seq FROM (
			SELECT k.seq, row_number() OVER (PARTITION BY k.subject ORDER BY k.seq DESC) AS newer
			FROM (`+strings.Join(parts, " UNION ALL ")+`) k) r
		WHERE r.newer > $3 ORDER BY seq`, st.id, int64(st.first), perSubject)
	if err != nil {
		return nil, fmt.Errorf("find messages over the per-subject limit of stream %d: %w", st.id, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// fetchHead reads up to n of the oldest live rows at or after from.
func (db *DB) fetchHead(ctx context.Context, q querier, id int64, from uint64, n int) ([]liveRow, error) {
	rows, err := q.Query(ctx, `SELECT seq, size FROM jetgres.stream_head($1, $2, $3)`, id, int64(from), n)
	if err != nil {
		return nil, fmt.Errorf("read oldest messages of stream %d: %w", id, err)
	}
	return pgx.CollectRows(rows, scanLiveRow)
}

func scanLiveRow(r pgx.CollectableRow) (liveRow, error) {
	var lr liveRow
	err := r.Scan(&lr.seq, &lr.size)
	return lr, err
}

// PruneMsgIDs forgets a stream's de-duplication ids recorded before cutoff (unix ns), which
// are outside the duplicate window and can no longer match, by dropping the id buckets that
// hold nothing newer; it returns how many it dropped. Ids are never deleted one by one, so
// id handling leaves no dead tuples. A bucket followed by one opened at or before cutoff
// holds only older ids; the newest bucket, which an idle stream keeps, is read to be sure
// once its first id is older than cutoff. The stream's state row is locked first, as an
// append locks it before it lists the buckets to read: no append can be reading a bucket
// this drops, and a drop that would wait long gives up until the next prune.
func (db *DB) PruneMsgIDs(ctx context.Context, id int64, cutoff int64) (int64, error) {
	var n int64
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		if _, err := q.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, ChunkDropLockTimeout.Milliseconds())); err != nil {
			return err
		}
		rows, err := q.Query(ctx, `SELECT k.bucket, k.next_ts IS NULL FROM jetgres.stream_state st, LATERAL (
				SELECT b.bucket, b.first_ts, lead(b.first_ts) OVER (ORDER BY b.bucket) AS next_ts
				FROM jetgres.id_buckets b WHERE b.stream_id = st.stream_id) k
			WHERE st.stream_id = $1 AND (k.next_ts <= $2 OR k.next_ts IS NULL AND k.first_ts <= $2)
			ORDER BY k.bucket
			FOR UPDATE OF st`, id, cutoff)
		if err != nil {
			return err
		}
		type candidate struct {
			bucket int64
			newest bool
		}
		cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
			var c candidate
			err := r.Scan(&c.bucket, &c.newest)
			return c, err
		})
		if err != nil {
			return err
		}
		var drop []int64
		for _, c := range cands {
			if c.newest {
				var live bool
				if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+idBucketTable(id, c.bucket)+` WHERE ts > $1)`, cutoff).Scan(&live); err != nil {
					return err
				}
				if live {
					continue
				}
			}
			if _, err := q.Exec(ctx, `DROP TABLE IF EXISTS `+idBucketTable(id, c.bucket)); err != nil {
				return err
			}
			drop = append(drop, c.bucket)
		}
		if len(drop) > 0 {
			if _, err := q.Exec(ctx, `DELETE FROM jetgres.id_buckets WHERE stream_id = $1 AND bucket = ANY($2)`, id, drop); err != nil {
				return err
			}
		}
		n = int64(len(drop))
		return nil
	})
	if isLockTimeout(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pg: prune message ids: %w", err)
	}
	return n, nil
}

// idBucketTable is the quoted, schema-qualified name of a de-duplication id bucket, as
// jetgres.id_bucket_table spells it in SQL. Only numbers go into it.
func idBucketTable(streamID, bucket int64) string {
	return pgx.Identifier{"jetgres", fmt.Sprintf("ids_%d_%d", streamID, bucket)}.Sanitize()
}
