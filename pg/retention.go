package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

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
}

func lockState(ctx context.Context, q Querier, id int64) (*stateRow, error) {
	st := &stateRow{id: id}
	err := q.QueryRow(ctx, `SELECT first_seq, last_seq, cum_bytes, msgs, bytes FROM jetgres.stream_state
		WHERE stream_id = $1 FOR UPDATE`, id).Scan(&st.first, &st.last, &st.cumBytes, &st.msgs, &st.bytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("lock state of stream %d: %w", id, err)
	}
	return st, nil
}

func (st *stateRow) save(ctx context.Context, q Querier) error {
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
func (db *DB) advanceFirst(ctx context.Context, q Querier, st *stateRow, target uint64) (uint64, error) {
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
func (db *DB) cumAt(ctx context.Context, q Querier, id int64, seq uint64) (uint64, error) {
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

// sqlSize is a chunk row m's stored size as MessageSize computes it.
const sqlSize = `(30 + octet_length(m.subject) + octet_length(m.data) +
	CASE WHEN coalesce(octet_length(m.hdr), 0) = 0 THEN 0 ELSE 4 + octet_length(m.hdr) END)`

// sqlLive is true for a chunk row that no tombstone covers; $1 is the stream id.
const sqlLive = `NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq)`

// tombstoneWhere leaves a tombstone on every live row in [from, upTo] that cond selects, and
// takes them out of the counts. cond is SQL on the chunk row m; its arguments follow $1
// (stream id), $2 and $3 (the range). It returns how many rows it removed.
func (db *DB) tombstoneWhere(ctx context.Context, q Querier, st *stateRow, from, upTo uint64, cond string, args ...any) (uint64, error) {
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
				SELECT $1, m.seq, `+sqlSize+` FROM `+chunkTable(st.id, c.chunk)+` m
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
func (db *DB) settleFirst(ctx context.Context, q Querier, st *stateRow) error {
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

// ExpireOlder removes a stream's messages stored at or before cutoff (unix ns): max_age.
// Timestamps grow with sequences, so this only moves the first sequence. It returns how many
// live messages it removed.
func (db *DB) ExpireOlder(ctx context.Context, id int64, cutoff int64) (uint64, error) {
	// Most of the time nothing is due: look at the first message without the lock, so that
	// the maintainer's once-a-second check does not queue behind appends.
	due := false
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
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
	if err != nil || !due {
		if err != nil && !errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("pg: expire messages: %w", err)
		}
		return 0, err
	}
	var removed uint64
	err = db.BackgroundTx(ctx, func(ctx context.Context, q Querier) error {
		st, err := lockState(ctx, q, id)
		if err != nil || st.msgs == 0 {
			return err
		}
		chunks, err := db.chunks.list(ctx, q, id, st.last)
		if err != nil {
			return err
		}
		target := st.last + 1
		for _, c := range liveChunks(chunks, st.first, st.last) {
			var seq *int64
			err := q.QueryRow(ctx, `SELECT min(seq) FROM `+chunkTable(id, c.chunk)+` WHERE seq >= $1 AND ts > $2`,
				int64(st.first), cutoff).Scan(&seq)
			if err != nil {
				return fmt.Errorf("find unexpired messages of stream %d: %w", id, err)
			}
			if seq != nil {
				target = uint64(*seq)
				break
			}
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
	err := db.BackgroundTx(ctx, func(ctx context.Context, q Querier) error {
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
func (db *DB) saveIf(ctx context.Context, q Querier, st *stateRow, removed uint64) error {
	if removed == 0 {
		return nil
	}
	return st.save(ctx, q)
}

// overPerSubject returns, in order, the live messages of a stream that have more than
// perSubject newer live messages of their subject.
func (db *DB) overPerSubject(ctx context.Context, q Querier, st *stateRow, perSubject int64) ([]int64, error) {
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
func (db *DB) fetchHead(ctx context.Context, q Querier, id int64, from uint64, n int) ([]liveRow, error) {
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

// SeqRange is an inclusive range of stream sequences.
type SeqRange struct {
	From, To uint64
}

// RetainConsumer is what interest and workqueue retention need of one consumer.
type RetainConsumer struct {
	Floor   uint64   // the ack floor: everything at or below it is acknowledged
	Filters []string // empty: every subject
	Acked   []uint64 // acknowledged above the floor
}

func (c *RetainConsumer) matches(subject string) bool {
	if len(c.Filters) == 0 {
		return true
	}
	for _, f := range c.Filters {
		if SubjectMatches(f, subject) {
			return true
		}
	}
	return false
}

func (c *RetainConsumer) done(seq uint64) bool {
	_, acked := slices.BinarySearch(c.Acked, seq)
	return seq <= c.Floor || acked
}

// RetainParams asks Retain to remove what no consumer needs any more.
type RetainParams struct {
	StreamID int64
	// WorkQueue keeps messages that no consumer's filter matches (workqueue retention);
	// otherwise nothing keeps them (interest retention).
	WorkQueue bool
	Consumers []RetainConsumer
	// Recheck are ranges where a message may have lost the last consumer that needed it
	// through a floor moving, a consumer going away or filters changing. Messages below the
	// first one still needed are found without them.
	Recheck []SeqRange
}

// RetainResult is what Retain did.
type RetainResult struct {
	FirstSeq   uint64
	Removed    uint64   // live messages removed
	Tombstoned uint64   // of which left as tombstones above the first sequence
	Gone       []uint64 // the Acked sequences that are no longer live, removed now or before
}

// Retain applies interest or workqueue retention: a message is removed once every consumer
// whose filter matches it has acknowledged it (and, for a work queue, some consumer's filter
// matches it). The first sequence moves past every such message at the front; messages
// further on are tombstoned. Like every removal it is one transaction under the state row's
// lock, and it never updates or deletes a message row.
func (db *DB) Retain(ctx context.Context, p RetainParams) (RetainResult, error) {
	var res RetainResult
	err := db.BackgroundTx(ctx, func(ctx context.Context, q Querier) error {
		res = RetainResult{}
		st, err := lockState(ctx, q, p.StreamID)
		if err != nil {
			return err
		}
		r := retainer{db: db, q: q, st: st, p: &p}
		before := st.msgs
		front, err := r.firstNeeded(ctx, st.first)
		if err != nil {
			return err
		}
		if err := r.tombstoneAcked(ctx, front); err != nil {
			return err
		}
		for _, rg := range p.Recheck {
			n, err := r.tombstoneUnneeded(ctx, max(rg.From, front+1), rg.To)
			if err != nil {
				return err
			}
			res.Tombstoned += n
		}
		res.Tombstoned += r.tombstoned
		if front, err = r.firstNeeded(ctx, front); err != nil {
			return err
		}
		if _, err := db.advanceFirst(ctx, q, st, front); err != nil {
			return err
		}
		res.FirstSeq = st.first
		res.Removed = before - st.msgs
		res.Gone = r.gone
		for _, c := range p.Consumers {
			for _, seq := range c.Acked {
				if seq < st.first {
					res.Gone = append(res.Gone, seq)
				}
			}
		}
		return db.saveIf(ctx, q, st, res.Removed)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return RetainResult{}, fmt.Errorf("pg: retention: %w", err)
	}
	return res, err
}

// retainer is one Retain transaction.
type retainer struct {
	db         *DB
	q          Querier
	st         *stateRow
	p          *RetainParams
	tombstoned uint64
	gone       []uint64
}

// filtered reports whether some consumer is filtered, so that whether a message is needed
// depends on its subject.
func (r *retainer) filtered() bool {
	for _, c := range r.p.Consumers {
		if len(c.Filters) > 0 && !slices.Contains(c.Filters, ">") {
			return true
		}
	}
	return false
}

// floorNeeded is SQL that is true for a chunk row m that some consumer's floor still holds:
// a consumer whose filter matches it has not acknowledged through it, or, in a work queue, no
// consumer's filter matches it. Its placeholders start at $(base+1); it returns their values.
func (r *retainer) floorNeeded(base int) (string, []any) {
	var floors []int64
	var res []string
	for _, c := range r.p.Consumers {
		filters := c.Filters
		if len(filters) == 0 {
			filters = []string{">"}
		}
		for _, f := range filters {
			floors = append(floors, int64(c.Floor))
			res = append(res, SubjectRegexp(f))
		}
	}
	return fmt.Sprintf(`(EXISTS (SELECT 1 FROM unnest($%d::bigint[], $%d::text[]) c(floor, re)
			WHERE m.seq > c.floor AND m.subject ~ c.re)
		OR ($%d AND NOT m.subject ~ ANY($%d::text[])))`, base+1, base+2, base+3, base+2),
		[]any{floors, res, r.p.WorkQueue}
}

// firstNeeded is the first live sequence at or after from that some consumer's floor still
// holds, or last + 1.
func (r *retainer) firstNeeded(ctx context.Context, from uint64) (uint64, error) {
	st := r.st
	from = max(from, st.first)
	if len(r.p.Consumers) == 0 {
		if r.p.WorkQueue {
			return from, nil
		}
		return st.last + 1, nil
	}
	if !r.filtered() {
		low := r.p.Consumers[0].Floor
		for _, c := range r.p.Consumers[1:] {
			low = min(low, c.Floor)
		}
		from = max(from, low+1)
		if from > st.last {
			return st.last + 1, nil
		}
		m, err := r.db.messageAt(ctx, r.q, st.id, from, st.last)
		if err != nil || m == nil {
			return st.last + 1, err
		}
		return m.Seq, nil
	}
	if from > st.last {
		return st.last + 1, nil
	}
	chunks, err := r.db.chunks.list(ctx, r.q, st.id, st.last)
	if err != nil {
		return 0, err
	}
	cond, args := r.floorNeeded(3)
	for _, c := range liveChunks(chunks, from, st.last) {
		var seq *int64
		err := r.q.QueryRow(ctx, `SELECT min(m.seq) FROM `+chunkTable(st.id, c.chunk)+` m
			WHERE m.seq BETWEEN $2 AND $3 AND `+sqlLive+` AND `+cond,
			append([]any{st.id, int64(from), int64(st.last)}, args...)...).Scan(&seq)
		if err != nil {
			return 0, fmt.Errorf("find first needed message of stream %d: %w", st.id, err)
		}
		if seq != nil {
			return uint64(*seq), nil
		}
	}
	return st.last + 1, nil
}

// tombstoneUnneeded tombstones the live messages in [from, to] that no consumer's floor holds.
func (r *retainer) tombstoneUnneeded(ctx context.Context, from, to uint64) (uint64, error) {
	if !r.filtered() {
		// Unfiltered, the lowest floor holds every message above it, and the first
		// sequence moves up to it.
		return 0, nil
	}
	cond, args := r.floorNeeded(3)
	return r.db.tombstoneWhere(ctx, r.q, r.st, from, to, `NOT `+cond, args...)
}

// tombstoneAcked removes the individually acknowledged messages at or after front that every
// consumer they concern has acknowledged.
func (r *retainer) tombstoneAcked(ctx context.Context, front uint64) error {
	var cand []uint64
	for _, c := range r.p.Consumers {
		for _, seq := range c.Acked {
			if seq >= front && seq <= r.st.last {
				cand = append(cand, seq)
			}
		}
	}
	if len(cand) == 0 {
		return nil
	}
	slices.Sort(cand)
	cand = slices.Compact(cand)
	subjects, err := r.subjectsOf(ctx, cand)
	if err != nil {
		return err
	}
	var kill []int64
	for _, seq := range cand {
		subj, live := subjects[seq]
		if !live {
			r.gone = append(r.gone, seq)
			continue
		}
		if r.removable(seq, subj) {
			kill = append(kill, int64(seq))
			r.gone = append(r.gone, seq)
		}
	}
	if len(kill) == 0 {
		return nil
	}
	n, err := r.db.tombstoneWhere(ctx, r.q, r.st, uint64(kill[0]), uint64(kill[len(kill)-1]), `m.seq = ANY($4)`, kill)
	r.tombstoned += n
	return err
}

// removable decides one message from the consumers' floors and acknowledgements.
func (r *retainer) removable(seq uint64, subject string) bool {
	matched := false
	for i := range r.p.Consumers {
		c := &r.p.Consumers[i]
		if !c.matches(subject) {
			continue
		}
		matched = true
		if !c.done(seq) {
			return false
		}
	}
	return matched || !r.p.WorkQueue
}

// subjectsOf returns the subjects of the live messages among seqs (sorted).
func (r *retainer) subjectsOf(ctx context.Context, seqs []uint64) (map[uint64]string, error) {
	st := r.st
	chunks, err := r.db.chunks.list(ctx, r.q, st.id, seqs[len(seqs)-1])
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]string, len(seqs))
	want := make([]int64, len(seqs))
	for i, s := range seqs {
		want[i] = int64(s)
	}
	for _, c := range liveChunks(chunks, seqs[0], seqs[len(seqs)-1]) {
		rows, err := r.q.Query(ctx, `SELECT m.seq, m.subject FROM `+chunkTable(st.id, c.chunk)+` m
			WHERE m.seq = ANY($2) AND `+sqlLive, st.id, want)
		if err != nil {
			return nil, fmt.Errorf("read subjects of acknowledged messages of stream %d: %w", st.id, err)
		}
		for rows.Next() {
			var seq uint64
			var subj string
			if err := rows.Scan(&seq, &subj); err != nil {
				rows.Close()
				return nil, err
			}
			out[seq] = subj
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ChunkDropLockTimeout bounds how long dropping a chunk table waits for its lock. Only
// readers of messages already gone can hold one, but a DROP that waited would queue every
// later reader of that table behind it; giving up and trying again later is cheaper.
const ChunkDropLockTimeout = 100 * time.Millisecond

// DropChunks drops the chunk tables of a stream that its first sequence has passed, with
// their chunk rows and the tombstones that fell in them, one short transaction each. When the
// stream is empty and has seen no append for idle, the chunk that receives appends is
// retired first, so that a consumed stream gives back its last chunk too. It returns how many
// tables it dropped.
func (db *DB) DropChunks(ctx context.Context, id int64, idle time.Duration) (int, error) {
	if err := db.retireIdleChunk(ctx, id, idle); err != nil {
		return 0, err
	}
	var droppable []SeqRange
	var chunkIDs []int64
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		var first uint64
		if err := q.QueryRow(ctx, `SELECT first_seq FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&first); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		rows, err := q.Query(ctx, `SELECT chunk, first_seq, next_first FROM (
				SELECT chunk, first_seq, lead(first_seq) OVER (ORDER BY chunk) AS next_first
				FROM jetgres.chunks WHERE stream_id = $1) k
			WHERE next_first <= $2 ORDER BY chunk`, id, int64(first))
		if err != nil {
			return err
		}
		for rows.Next() {
			var chunk int64
			var r SeqRange
			if err := rows.Scan(&chunk, &r.From, &r.To); err != nil {
				rows.Close()
				return err
			}
			chunkIDs = append(chunkIDs, chunk)
			droppable = append(droppable, r)
		}
		rows.Close()
		return rows.Err()
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return 0, err
		}
		return 0, fmt.Errorf("pg: list chunks to drop: %w", err)
	}
	dropped := 0
	for i, chunk := range chunkIDs {
		err := db.BackgroundTx(ctx, func(ctx context.Context, q Querier) error {
			if _, err := q.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, ChunkDropLockTimeout.Milliseconds())); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, `DROP TABLE IF EXISTS `+chunkTable(id, chunk)); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, `DELETE FROM jetgres.chunks WHERE stream_id = $1 AND chunk = $2`, id, chunk); err != nil {
				return err
			}
			_, err := q.Exec(ctx, `DELETE FROM jetgres.deleted WHERE stream_id = $1 AND seq < $2`, id, int64(droppable[i].To))
			return err
		})
		if isLockTimeout(err) {
			break
		}
		if err != nil {
			return dropped, fmt.Errorf("pg: drop chunk %d of stream %d: %w", chunk, id, err)
		}
		db.chunks.dropped(id, chunk)
		dropped++
	}
	return dropped, nil
}

// retireIdleChunk opens a new, empty chunk for a stream that holds nothing and has seen no
// append for idle, so that the chunk that received its last messages can be dropped. Idle
// keeps a stream that empties and refills many times a second from creating and dropping a
// table each time.
func (db *DB) retireIdleChunk(ctx context.Context, id int64, idle time.Duration) error {
	const sqlIdle = `SELECT first_seq > last_seq AND chunk_rows > 0 AND last_ts < $2, last_seq, chunk
		FROM jetgres.stream_state WHERE stream_id = $1`
	before := time.Now().Add(-idle).UnixNano()
	var retire bool
	var last, chunk int64
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		return q.QueryRow(ctx, sqlIdle, id, before).Scan(&retire, &last, &chunk)
	})
	if err == nil && retire {
		// Check again under the lock: an append may have come in between.
		err = db.BackgroundTx(ctx, func(ctx context.Context, q Querier) error {
			if err := q.QueryRow(ctx, sqlIdle+` FOR UPDATE`, id, before).Scan(&retire, &last, &chunk); err != nil || !retire {
				return err
			}
			if err := createChunk(ctx, q, id, chunk+1, uint64(last+1)); err != nil {
				return err
			}
			_, err := q.Exec(ctx, `UPDATE jetgres.stream_state SET chunk = $2, chunk_rows = 0 WHERE stream_id = $1`, id, chunk+1)
			return err
		})
		if err == nil && retire {
			db.chunks.add(id, chunkInfo{chunk: chunk + 1, firstSeq: uint64(last + 1)})
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	case err != nil:
		return fmt.Errorf("pg: retire idle chunk of stream %d: %w", id, err)
	}
	return nil
}

func isLockTimeout(err error) bool { return hasSQLState(err, "55P03") }

// PruneMsgIDs forgets a stream's de-duplication ids recorded before cutoff (unix ns): they
// are outside the duplicate window and can no longer match.
func (db *DB) PruneMsgIDs(ctx context.Context, id int64, cutoff int64) (int64, error) {
	var n int64
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
		tag, err := q.Exec(ctx, `DELETE FROM jetgres.msg_ids WHERE stream_id = $1 AND ts < $2`, id, cutoff)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pg: prune message ids: %w", err)
	}
	return n, nil
}
