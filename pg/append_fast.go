package pg

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
)

// The common publish carries no message id, no expectation, and goes to a stream without
// limits. For it the general append (lock the state row, decide, then write and commit: two
// round trips) is more than needed: this process already knows the stream's state from its
// own last commit, since a stream has at most one flush in flight. The fast path sends the
// state update and the inserts in one pipeline, one implicit transaction, one round trip,
// and lets PostgreSQL check the remembered state.
//
// The state row update is guarded by the remembered last sequence and chunk: if another
// replica, a purge or the maintainer changed them, it matches no row, and the inserts,
// which read the update's result in the same statement, insert nothing either. Those
// batches then take the general path. A collision the guards cannot see (another replica
// wrote exactly as many messages into the same chunk) fails the primary key, which rolls
// the whole implicit transaction back; the general path then runs for every batch.

// tailState is what this process last committed for a stream: the fast path's starting
// point, and, for streams with limits, what the next append predicts its evictions from.
type tailState struct {
	firstSeq          uint64
	lastSeq, cumBytes uint64
	msgs, bytes       uint64
	lastTS            int64
	chunk, chunkRows  int64
	memory            bool // sizes count as a memory stream's (see MessageSize)
}

// tailStates remembers each stream's tailState.
type tailStates struct {
	mu sync.Mutex
	m  map[int64]tailState
}

func (t *tailStates) get(id int64) (tailState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.m[id]
	return s, ok
}

func (t *tailStates) set(id int64, s tailState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[int64]tailState)
	}
	t.m[id] = s
}

// seed sets id's state unless this process knows one already: what it committed itself is
// at least as recent as what it read.
func (t *tailStates) seed(id int64, s tailState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[int64]tailState)
	}
	if _, ok := t.m[id]; !ok {
		t.m[id] = s
	}
}

func (t *tailStates) forget(id int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}

func (t *tailStates) remember(id int64, st *lockedState) {
	t.set(id, tailState{firstSeq: st.firstSeq, lastSeq: st.lastSeq, cumBytes: st.cumBytes, msgs: st.msgs, bytes: st.bytes,
		lastTS: st.lastTS, chunk: st.chunk, chunkRows: st.chunkRows, memory: st.memory})
}

// fastEligible reports whether a batch can take the fast path: nothing in it needs a
// decision under the row lock, it fits in the current chunk, its sequences stay within
// MaxSeq, and it stays within max_msgs and max_bytes, so that no limit refuses or evicts.
// The counts st remembers can only be above the row's while the guard holds: the row's last
// sequence is st's, so nothing was appended since, and what retention removed only lowered
// them. A stream made by nats bench has a max_bytes of 1 GB, and most streams never reach
// theirs.
func fastEligible(bt AppendBatch, st tailState) bool {
	l := bt.Limits
	if l.MaxMsgsPer > 0 || !fastShape(bt, st, false) {
		return false
	}
	if l.MaxMsgs <= 0 && l.MaxBytes <= 0 {
		return true
	}
	n, nbytes := batchSize(bt, st.memory)
	return (l.MaxMsgs <= 0 || st.msgs+uint64(n) <= uint64(l.MaxMsgs)) && (l.MaxBytes <= 0 || st.bytes+nbytes <= uint64(l.MaxBytes))
}

// fastShape reports whether a batch's messages need no decision under the row lock, fit in
// the current chunk, and keep their sequences within MaxSeq. derived lets through the
// derived messages, which the caller derives from what it remembers.
func fastShape(bt AppendBatch, st tailState, derived bool) bool {
	if len(bt.Msgs) >= copyThreshold {
		return false
	}
	if st.chunkRows+int64(len(bt.Msgs)) > bt.chunkRows() || st.lastSeq > MaxSeq-uint64(len(bt.Msgs)) {
		return false
	}
	for i := range bt.Msgs {
		m := &bt.Msgs[i]
		if m.MsgID != "" || m.NoInterest || (m.Derive != nil && !derived) || m.ExpectLastSeq != nil || m.ExpectLastSubjSeq != nil || m.ExpectLastMsgID != "" || m.Rollup != RollupNone || m.TTL != 0 || m.Purge != "" {
			return false
		}
	}
	return true
}

// fastIndexed reports whether a batch for a stream with limits can take the fast path with
// the stream's subject index x: x describes the state this process last committed, no
// per-subject limit refuses, and the batch stays within max_msgs and max_bytes even before
// any replacement, so that no limit refuses or evicts.
func fastIndexed(bt AppendBatch, st tailState, x *subjectIndex) bool {
	l := bt.Limits
	if x == nil || l.MaxMsgsPer <= 0 || l.DiscardNewPer || !fastShape(bt, st, false) || !x.matches(st.firstSeq, st.lastSeq, st.msgs, st.bytes) {
		return false
	}
	n, nbytes := batchSize(bt, st.memory)
	return (l.MaxMsgs <= 0 || x.msgs+uint64(n) <= uint64(l.MaxMsgs)) && (l.MaxBytes <= 0 || x.bytes+nbytes <= uint64(l.MaxBytes))
}

// fastPlan is one batch the fast path appends: the stream's state before and after it.
type fastPlan struct {
	bt         AppendBatch
	prev, next tailState
	res        AppendResult
	idx        *subjectIndex // for a stream with limits: its index, moved to next
	tombs      []liveRow     // the rows the per-subject limit replaces
	lasts      *streamLasts  // for derived messages: their subjects' last ones, moved to next
}

// appendFast appends the batches that are eligible in one round trip and returns their
// results; rest holds the batches the general path must take. It writes nothing when no
// batch is eligible.
func (db *DB) appendFast(ctx context.Context, q querier, batches []AppendBatch, ts int64) (done []AppendResult, rest []AppendBatch, err error) {
	var plans []fastPlan
	for _, bt := range batches {
		st, ok := db.tails.get(bt.StreamID)
		if len(deriveSubjects(bt)) > 0 {
			if p, fast := db.fastDerived(bt, st, ok, ts); fast {
				plans = append(plans, p)
			} else {
				rest = append(rest, bt)
			}
			continue
		}
		var idx *subjectIndex
		if ok && bt.Limits.MaxMsgsPer > 0 {
			idx = db.subjects.take(bt.StreamID)
		}
		if !ok || !fastEligible(bt, st) && !fastIndexed(bt, st, idx) {
			if idx != nil {
				// The general path brings the index along, or drops it.
				db.subjects.put(bt.StreamID, idx)
			}
			rest = append(rest, bt)
			continue
		}
		p := fastPlan{bt: bt, prev: st, next: st, idx: idx}
		p.next.lastTS = max(st.lastTS, ts)
		p.res = AppendResult{StreamID: bt.StreamID, Outcomes: make([]Outcome, len(bt.Msgs)), Stored: make([]Message, 0, len(bt.Msgs))}
		for j, m := range bt.Msgs {
			p.next.lastSeq++
			msg := Message{Seq: p.next.lastSeq, TS: p.next.lastTS, Subject: m.Subject, Header: m.Header, Data: m.Data, cumBefore: p.next.cumBytes}
			p.next.cumBytes += MessageSize(st.memory, m.Subject, m.Header, m.Data)
			p.res.Stored = append(p.res.Stored, msg)
			p.res.Outcomes[j] = Outcome{Seq: msg.Seq}
			if idx != nil {
				p.tombs = idx.add(m.Subject, liveRow{seq: msg.Seq, size: MessageSize(st.memory, m.Subject, m.Header, m.Data)}, bt.Limits.MaxMsgsPer, p.tombs)
			}
		}
		p.next.chunkRows += int64(len(bt.Msgs))
		p.next.msgs += uint64(len(bt.Msgs))
		p.next.bytes += p.next.cumBytes - st.cumBytes
		if idx != nil {
			idx.settle()
			p.next.firstSeq, p.next.msgs, p.next.bytes = idx.first, idx.msgs, idx.bytes
			if len(p.tombs) > 0 {
				p.res.Removed = true
				for _, t := range p.tombs {
					p.res.Tombstoned = append(p.res.Tombstoned, t.seq)
				}
			}
		}
		p.res.LastSeq = p.next.lastSeq
		plans = append(plans, p)
	}
	if len(plans) == 0 {
		return nil, rest, nil
	}
	b := &pgx.Batch{}
	mode := db.queueCommitMode(q, b)
	var plain []int
	for i, p := range plans {
		if p.idx == nil && p.lasts == nil {
			plain = append(plain, i)
		}
	}
	if len(plain) > 0 {
		queueGuardedAppends(b, plans, plain)
	}
	// The replace statements find their rows locked by the first statement when it ran.
	for _, p := range plans {
		if p.idx != nil || p.lasts != nil {
			queueGuardedReplace(b, p.bt.StreamID, p.prev, p.next, p.res.Stored, p.tombs)
		}
	}
	applied, err := readFastResults(q.SendBatch(ctx, b), mode, len(plans), plain, func(i int) int64 { return plans[i].bt.StreamID },
		func(i int, first uint64) { plans[i].res.FirstSeq, plans[i].next.firstSeq = first, first })
	if err != nil {
		for _, p := range plans {
			db.tails.forget(p.bt.StreamID)
		}
		return nil, nil, db.commitFailed(q, err, false, fastDoubts(plans))
	}
	for i, p := range plans {
		if !applied[i] {
			db.tails.forget(p.bt.StreamID)
			rest = append(rest, p.bt)
			continue
		}
		db.tails.set(p.bt.StreamID, p.next)
		if p.lasts != nil {
			db.lasts.put(p.bt.StreamID, p.lasts)
		}
		if p.idx != nil {
			db.subjects.put(p.bt.StreamID, p.idx)
			// A row the batch itself replaced was inserted for its tombstone, but is not held.
			if len(p.tombs) > 0 {
				p.res.Stored = slices.DeleteFunc(p.res.Stored, func(m Message) bool { return slices.Contains(p.res.Tombstoned, m.Seq) })
			}
		}
		db.chunks.committed(p.bt.StreamID, p.next.chunk, p.next.lastSeq)
		done = append(done, p.res)
	}
	return done, rest, nil
}

// fastDoubts is what each plan's batch stores if the statement committed and its guard held.
func fastDoubts(plans []fastPlan) []inDoubt {
	doubts := make([]inDoubt, len(plans))
	for i, p := range plans {
		d := &doubts[i]
		d.before, d.chunk = p.prev.lastSeq, p.prev.chunk
		d.probe, d.probed = p.res.Stored[len(p.res.Stored)-1], true
		d.res = p.res
		d.res.FirstSeq = p.next.firstSeq
		if len(p.tombs) > 0 {
			d.res.Stored = slices.DeleteFunc(slices.Clone(p.res.Stored), func(m Message) bool { return slices.Contains(p.res.Tombstoned, m.Seq) })
		}
	}
	return doubts
}

// readFastResults reads, per planned batch, whether its guarded state update matched, after
// skip results of the statements before the first: first the one statement of the plain
// batches (the plans at indexes plain), which returns a row for each stream it moved, then
// one statement for each of the others, in order.
func readFastResults(br pgx.BatchResults, skip, n int, plain []int, streamOf func(i int) int64, firstSeq func(i int, first uint64)) ([]bool, error) {
	if err := skipResults(br, skip); err != nil {
		br.Close()
		return nil, err
	}
	applied, isPlain := make([]bool, n), make([]bool, n)
	for _, i := range plain {
		isPlain[i] = true
	}
	if len(plain) > 0 {
		moved := make(map[int64]uint64, len(plain))
		rows, err := br.Query()
		if err != nil {
			br.Close()
			return nil, err
		}
		for rows.Next() {
			var id, first int64
			if err := rows.Scan(&id, &first); err != nil {
				rows.Close()
				br.Close()
				return nil, err
			}
			moved[id] = uint64(first)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			br.Close()
			return nil, err
		}
		for _, i := range plain {
			if first, ok := moved[streamOf(i)]; ok {
				applied[i] = true
				firstSeq(i, first)
			}
		}
	}
	for i := range n {
		if isPlain[i] {
			continue
		}
		var first int64
		switch err := br.QueryRow().Scan(&first); {
		case err == nil:
			applied[i] = true
			firstSeq(i, uint64(first))
		case errors.Is(err, pgx.ErrNoRows):
		default:
			br.Close()
			return nil, err
		}
	}
	return applied, br.Close()
}

// queueGuardedAppends moves the state rows of the plain plans (those at indexes plain) from
// prev to next and inserts their messages, in one statement whatever the number of streams,
// which returns each moved stream's id and first sequence. The insert joins the update's
// result, so a stream whose row was not at prev gets nothing inserted, and the others are
// unaffected by it. It first locks the rows of every plan, the others' too, in stream id
// order, as the general path locks them, so that two transactions fusing overlapping
// streams (of two replicas, or the publish path's and the SQL mover's) cannot deadlock.
// The lock is one index scan of all the ids, sorted, under the locking node, and the update
// finds the locked rows by their ctid, so that its plan is a nested loop of TID probes
// whatever the number of streams, where a join on stream_id was planned, generically, as
// two sequential scans of every stream's state row with hash joins, costing a third more
// at 256 streams and growing with the number of streams (pgbench, PostgreSQL 15). A lateral
// lookup that locked one id at a time cost PostgreSQL a third more than the one scan for
// the lock and the update of 256 streams (EXPLAIN ANALYZE, PostgreSQL 15).
//
// One message of one stream alone, the lone publish, goes as scalar parameters, which costs
// PostgreSQL less than unnesting arrays of one.
func queueGuardedAppends(b *pgx.Batch, plans []fastPlan, plain []int) {
	if p := &plans[plain[0]]; len(plans) == 1 && len(p.res.Stored) == 1 {
		m := &p.res.Stored[0]
		b.Queue(`WITH u AS (UPDATE jetgres.stream_state SET last_seq = $2, last_ts = $3, cum_bytes = $4, msgs = msgs + 1,
				bytes = bytes + $5, chunk_rows = $6, last_msg_id = ''
				WHERE stream_id = $1 AND last_seq = $7 AND chunk = $8 AND chunk_rows = $9
				RETURNING stream_id, first_seq, chunk),
			i AS (INSERT INTO jetgres.msgs (stream_id, chunk, seq, ts, subject, hdr, data, cum_before)
				SELECT u.stream_id, u.chunk, $10, $11, $12, $13, $14, $15 FROM u)
			SELECT stream_id, first_seq FROM u`,
			append([]any{p.bt.StreamID, int64(p.next.lastSeq), p.next.lastTS, int64(p.next.cumBytes), int64(p.next.cumBytes - p.prev.cumBytes),
				p.next.chunkRows, int64(p.prev.lastSeq), p.prev.chunk, p.prev.chunkRows}, m.columns()...)...)
		return
	}
	// Every plan's row is locked, in order; only the plain plans' rows are moved, the others
	// are left to their own statements.
	locked := make([]int64, len(plans))
	for i := range plans {
		locked[i] = plans[i].bt.StreamID
	}
	n := len(plain)
	ids, lasts, tss, cums, counts, sizes, rows := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	prevLasts, prevChunks, prevRows := make([]int64, n), make([]int64, n), make([]int64, n)
	total := 0
	for _, i := range plain {
		total += len(plans[i].res.Stored)
	}
	msgs, owners := plans[plain[0]].res.Stored, make([]int64, 0, total)
	if n > 1 {
		msgs = make([]Message, 0, total)
	}
	for k, i := range plain {
		p := &plans[i]
		ids[k] = p.bt.StreamID
		lasts[k], tss[k], cums[k] = int64(p.next.lastSeq), p.next.lastTS, int64(p.next.cumBytes)
		counts[k], sizes[k], rows[k] = int64(len(p.res.Stored)), int64(p.next.cumBytes-p.prev.cumBytes), p.next.chunkRows
		prevLasts[k], prevChunks[k], prevRows[k] = int64(p.prev.lastSeq), p.prev.chunk, p.prev.chunkRows
		if n > 1 {
			msgs = append(msgs, p.res.Stored...)
		}
		for range p.res.Stored {
			owners = append(owners, p.bt.StreamID)
		}
	}
	seqs, mts, subjects, hdrs, datas, cumBefores := insertColumns(msgs)
	b.Queue(`WITH l AS MATERIALIZED (SELECT stream_id, ctid AS tid FROM jetgres.stream_state
			WHERE stream_id = ANY($1::bigint[]) ORDER BY stream_id FOR UPDATE),
		u AS (UPDATE jetgres.stream_state s SET last_seq = n.last_seq, last_ts = n.last_ts, cum_bytes = n.cum_bytes,
				msgs = s.msgs + n.msgs, bytes = s.bytes + n.bytes, chunk_rows = n.chunk_rows, last_msg_id = ''
			FROM l, unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[],
					$9::bigint[], $10::bigint[], $11::bigint[])
				AS n(id, last_seq, last_ts, cum_bytes, msgs, bytes, chunk_rows, prev_last, prev_chunk, prev_rows)
			WHERE l.stream_id = n.id AND s.ctid = l.tid AND s.last_seq = n.prev_last AND s.chunk = n.prev_chunk
				AND s.chunk_rows = n.prev_rows
			RETURNING s.stream_id, s.first_seq, s.chunk),
		i AS (INSERT INTO jetgres.msgs (stream_id, chunk, seq, ts, subject, hdr, data, cum_before)
			SELECT u.stream_id, u.chunk, r.seq, r.ts, r.subject, r.hdr, r.data, r.cum_before
			FROM u JOIN unnest($12::bigint[], $13::bigint[], $14::bigint[], $15::text[], $16::bytea[], $17::bytea[], $18::bigint[])
				AS r(stream_id, seq, ts, subject, hdr, data, cum_before) ON r.stream_id = u.stream_id)
		SELECT stream_id, first_seq FROM u`,
		locked, ids, lasts, tss, cums, counts, sizes, rows, prevLasts, prevChunks, prevRows,
		owners, seqs, mts, subjects, hdrs, datas, cumBefores)
}

// queueGuardedReplace is queueGuardedAppend for a stream with limits, whose counts and first
// sequence the subject index decided, and for derived messages, which were derived from that
// state: the update sets them and is guarded by all of them, and the tombstones of the rows
// the per-subject limit replaces go in with the inserts.
func queueGuardedReplace(b *pgx.Batch, streamID int64, prev, next tailState, msgs []Message, tombs []liveRow) {
	seqs, tss, subjects, hdrs, datas, cums := insertColumns(msgs)
	args := []any{streamID, int64(next.firstSeq), int64(next.lastSeq), next.lastTS, int64(next.cumBytes), int64(next.msgs),
		int64(next.bytes), next.chunkRows, int64(prev.firstSeq), int64(prev.lastSeq), int64(prev.msgs), int64(prev.bytes),
		prev.chunk, prev.chunkRows, seqs, tss, subjects, hdrs, datas, cums}
	// A put of a new key replaces nothing; its statement leaves the tombstones out.
	deleted := ""
	if len(tombs) > 0 {
		tseqs, tsizes := tombColumns(tombs)
		args = append(args, tseqs, tsizes)
		deleted = `, d AS (INSERT INTO jetgres.deleted (stream_id, seq, size)
			SELECT $1, t.s, t.z FROM u, unnest($21::bigint[], $22::bigint[]) AS t(s, z))`
	}
	b.Queue(`WITH u AS (UPDATE jetgres.stream_state SET first_seq = $2, last_seq = $3, last_ts = $4, cum_bytes = $5,
			msgs = $6, bytes = $7, chunk_rows = $8, last_msg_id = ''
			WHERE stream_id = $1 AND first_seq = $9 AND last_seq = $10 AND msgs = $11 AND bytes = $12
				AND chunk = $13 AND chunk_rows = $14
			RETURNING first_seq),
		i AS (INSERT INTO jetgres.msgs (stream_id, chunk, seq, ts, subject, hdr, data, cum_before)
			SELECT $1, $13, r.* FROM u, unnest($15::bigint[], $16::bigint[], $17::text[], $18::bytea[], $19::bytea[], $20::bigint[])
				AS r(seq, ts, subject, hdr, data, cum_before))`+deleted+`
		SELECT first_seq FROM u`, args...)
}
