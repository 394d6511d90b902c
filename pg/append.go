package pg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Rollup is what a Nats-Rollup header asks a stored message to replace.
type Rollup uint8

const (
	RollupNone    Rollup = iota
	RollupSubject        // "sub": the older messages of its subject
	RollupAll            // "all": every older message of the stream
)

// AppendMsg is one message to append, with the expectations the publisher set in its
// Nats-Expected-* headers, which only the stream's row lock can decide.
type AppendMsg struct {
	Subject string
	Header  []byte
	Data    []byte
	MsgID   string // Nats-Msg-Id, empty for none

	ExpectLastSeq        *uint64 // Nats-Expected-Last-Sequence
	ExpectLastSubjSeq    *uint64 // Nats-Expected-Last-Subject-Sequence
	ExpectLastSubjFilter string  // Nats-Expected-Last-Subject-Sequence-Subject (defaults to Subject)
	ExpectLastMsgID      string  // Nats-Expected-Last-Msg-Id

	// Rollup (Nats-Rollup) removes, once the message is stored, every older message of its
	// subject or of the whole stream.
	Rollup Rollup

	// NoInterest takes a sequence and stores nothing: under interest retention no consumer
	// wants the message, and JetStream answers such a publish with a sequence all the same.
	NoInterest bool

	// TTL (Nats-TTL) is how many seconds the message lives, TTLNever for ever (max_age passes
	// over it), 0 for as long as the stream's limits keep it (ttl.go).
	TTL int64
	// Derive, when set, makes the header and data stored in place of Header and Data, under
	// the stream's row lock, from the last live message of the subject (append_derive.go).
	Derive DeriveFunc
	// Purge, when set, removes every message of that other subject as the message is stored,
	// in its transaction; PurgeCheck may first refuse it (append_purge.go).
	Purge      string
	PurgeCheck PurgeCheckFunc
}

// chunkRows is the batch's chunk size with the default applied.
func (b AppendBatch) chunkRows() int64 {
	if b.ChunkRows <= 0 {
		return ChunkRowsDefault
	}
	return b.ChunkRows
}

// AppendBatch is the messages for one stream in one flush.
type AppendBatch struct {
	StreamID  int64
	DupWindow time.Duration // 0 disables de-duplication
	ChunkRows int64         // 0 means ChunkRowsDefault
	Limits    Limits
	Msgs      []AppendMsg
	// Atomic stores Msgs whole or not at all (append_atomic.go).
	Atomic bool
}

// Outcome is what happened to one AppendMsg. Exactly one of Stored, Duplicate or Err holds.
type Outcome struct {
	Seq       uint64 // the stored sequence, or the original's for a duplicate
	Duplicate bool
	Err       error  // an *ExpectError when an expectation failed, a *LimitError when a limit refused it, ErrSeqExhausted, or Derive's error
	Data      string // the data stored for a derived message (AppendMsg.Derive)
}

// ExpectError reports a failed Nats-Expected-* check together with the actual value.
type ExpectError struct {
	Kind    ExpectKind
	LastSeq uint64 // for ExpectLastSeqKind and ExpectLastSubjSeqKind
	LastID  string // for ExpectLastMsgIDKind
}

// ExpectKind names the expectation that failed.
type ExpectKind int

const (
	ExpectLastSeqKind ExpectKind = iota + 1
	ExpectLastSubjSeqKind
	ExpectLastMsgIDKind
)

func (e *ExpectError) Error() string {
	switch e.Kind {
	case ExpectLastSeqKind, ExpectLastSubjSeqKind:
		return fmt.Sprintf("wrong last sequence: %d", e.LastSeq)
	default:
		return fmt.Sprintf("wrong last msg ID: %s", e.LastID)
	}
}

// AppendResult is one batch's outcome: per message, and the rows committed that the stream
// still holds (for the tail).
type AppendResult struct {
	StreamID int64
	Outcomes []Outcome
	Stored   []Message
	LastSeq  uint64
	FirstSeq uint64
	// Removed says that limits took messages stored before, below FirstSeq or at the
	// Tombstoned sequences: a cache of the stream's messages may hold some that are gone.
	Removed    bool
	Tombstoned []uint64
	// Gone says that the stream was deleted before the transaction locked it: every outcome
	// is ErrNotFound, and the other streams of the transaction were stored all the same.
	Gone bool
}

// copyThreshold is the batch size from which COPY beats a multi-row INSERT.
const copyThreshold = 64

type lockedState struct {
	firstSeq, lastSeq, cumBytes uint64
	msgs, bytes                 uint64
	lastTS                      int64
	chunk, chunkRows            int64
	lastMsgID                   string
	memory                      bool // sizes count as a memory stream's (see MessageSize)
	// committedFirst is firstSeq as the row was read: what the batch evicts is still there
	// for the statements of this transaction.
	committedFirst uint64
}

// Append stores the batches of one or more streams in one transaction: lock each stream's
// state row (in stream id order, so concurrent multi-stream flushes cannot deadlock),
// decide de-duplication, expectations and limits, allocate dense sequences, insert, move the
// first sequence past what discard-old limits evict and tombstone what per-subject limits
// replace, commit. ts, unix nanoseconds on the replica's clock, moved onto PostgreSQL's
// clock (PGTime) and raised to the stream's last store time where it is below, is the store
// time given to every message: a stream's times never go backwards, whichever replica stores
// its messages and however far their clocks are apart. The returned rtt is the database round trip for
// the flow limiter, recorded whatever the outcome. batches is left as it was: the caller may
// still be walking it. The results, one per batch, name their streams and come in no
// particular order.
//
// When the commit was sent and no answer came back, the error is an *OutcomeUnknownError
// (ErrOutcomeUnknown): the batches may be stored or not, and Resolve tells which. Nothing
// that may have committed is ever run again.
//
// The batches the fast path can take commit in a transaction of their own, before the
// others. When the others then fail, the results still hold the fast path's batches, which
// are stored; the error is about the batches missing from them.
func (db *DB) Append(ctx context.Context, batches []AppendBatch, ts int64) ([]AppendResult, time.Duration, error) {
	ts = db.pgUnixNano(ts)
	// Streams are locked in id order, so that two transactions never deadlock on each other;
	// most calls hold one batch, or batches already in order, and need no copy.
	if !slices.IsSortedFunc(batches, byStreamID) {
		batches = slices.Clone(batches)
		slices.SortFunc(batches, byStreamID)
	}
	var results []AppendResult
	rtt, err := db.hot(ctx, func(ctx context.Context, q querier) error {
		results = nil
		done, rest, err := db.appendFast(ctx, q, batches, ts)
		switch {
		case errors.Is(err, ErrOutcomeUnknown):
			// It may have committed: only Resolve can tell whether the batches still
			// need storing.
			return err
		case err != nil:
			// The fast path's implicit transaction rolled back as a whole (a collision
			// its guards could not see, say); the general path decides afresh.
			done, rest = nil, batches
		}
		results = done
		if len(rest) > 0 {
			slow, err := db.appendTx(ctx, q, rest, ts, txEnds{first: "BEGIN"})
			if err != nil && len(done) > 0 {
				return committedBefore{err}
			}
			if err != nil {
				return err
			}
			results = append(results, slow...)
		}
		return nil
	})
	if err != nil {
		return results, rtt, fmt.Errorf("pg: append: %w", err)
	}
	return results, rtt, nil
}

// byStreamID orders batches as their streams are locked.
func byStreamID(a, b AppendBatch) int { return cmp.Compare(a.StreamID, b.StreamID) }

// txEnds is what appendTx runs besides the append: first, with firstArgs, at the head of its
// first round trip (BEGIN, or a statement of a transaction the caller opened: MoveStaged's
// progress), and last, when set, queues statements that depend on the outcomes just before
// the COMMIT (MoveStaged's rejections).
type txEnds struct {
	first     string
	firstArgs []any
	last      func(b *pgx.Batch, res []AppendResult)
}

// appendTx appends batches in one transaction, opened and ended as ends says.
func (db *DB) appendTx(ctx context.Context, q querier, batches []AppendBatch, ts int64, ends txEnds) (res []AppendResult, err error) {
	ids := make([]int64, len(batches))
	for i, b := range batches {
		ids[i] = b.StreamID
	}
	committed := false
	defer func() {
		// A failed pipeline leaves the transaction aborted; end it so the connection goes
		// back clean. Past the deadline the connection is destroyed instead.
		if !committed && ctx.Err() == nil {
			_, _ = q.Exec(ctx, "ROLLBACK")
		}
	}()

	// Round trip 1: open the transaction, lock the state rows, look up message ids, and read
	// what the streams' limits will need: the live messages of the batch's subjects and the
	// oldest messages an eviction is predicted to take.
	b := &pgx.Batch{}
	b.Queue(ends.first, ends.firstArgs...)
	mode := db.queueCommitMode(q, b)
	b.Queue(`SELECT stream_id, first_seq, last_seq, last_ts, cum_bytes, msgs, bytes, chunk, chunk_rows, last_msg_id, memory
		FROM jetgres.stream_state WHERE stream_id = ANY($1) ORDER BY stream_id FOR UPDATE`, ids)
	reads := make([]batchReads, len(batches))
	for i, bt := range batches {
		rd := &reads[i]
		if msgIDs := batchMsgIDs(bt); len(msgIDs) > 0 && bt.DupWindow > 0 {
			b.Queue(`SELECT msg_id, seq FROM jetgres.msg_ids_seen($1, $2, $3)`,
				bt.StreamID, msgIDs, ts-bt.DupWindow.Nanoseconds())
			rd.dups = true
		}
		if subjects := batchSubjects(bt); len(subjects) > 0 && (bt.Limits.MaxMsgsPer > 0 || rollsUpSubject(bt)) {
			// A per-subject limit needs at most that many live rows of each subject; a
			// subject rollup needs them all.
			var limit *int64
			if !rollsUpSubject(bt) {
				limit = &bt.Limits.MaxMsgsPer
			}
			b.Queue(`SELECT subject, seq, size FROM jetgres.subject_live($1, $2, $3)`, bt.StreamID, subjects, limit)
			rd.subjects = true
		}
		if rd.head = db.prefetchFor(bt); rd.head > 0 {
			b.Queue(`SELECT seq, size FROM jetgres.stream_head($1, NULL, $2)`, bt.StreamID, rd.head)
		}
		if subjects := deriveSubjects(bt); len(subjects) > 0 {
			queueLasts(b, bt.StreamID, subjects)
			rd.lasts = true
		}
	}
	br := q.SendBatch(ctx, b)
	states, err := readBatchReads(br, 1+mode, batches, reads)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}

	// Decide every message in order, then write.
	res = make([]AppendResult, len(batches))
	b = &pgx.Batch{}
	var copies []func() error
	var ins rowsInsert
	var opened []openedChunk
	holds := make([]*holdings, len(batches))
	befores := make([]lockedState, len(batches))
	indexes := make([]*subjectIndex, len(batches))
	lasts := make([]*streamLasts, len(batches))
	doubts := make([]inDoubt, len(batches))
	for i, bt := range batches {
		r := &res[i]
		r.StreamID = bt.StreamID
		r.Outcomes = make([]Outcome, len(bt.Msgs))
		st, ok := states[bt.StreamID]
		if !ok {
			r.Gone = true
			for j := range r.Outcomes {
				r.Outcomes[j].Err = fmt.Errorf("stream %d: %w", bt.StreamID, ErrNotFound)
			}
			continue
		}
		doubts[i].before = st.lastSeq
		r.Stored = make([]Message, 0, len(bt.Msgs))
		seen := reads[i].seen
		befores[i], indexes[i] = *st, db.subjects.take(bt.StreamID)
		if reads[i].lasts {
			lasts[i] = db.lasts.take(bt.StreamID)
		}
		if l := bt.Limits; l.MaxMsgsPer > 0 && !l.DiscardNewPer {
			x, err := db.subjectIndexFor(ctx, q, bt.StreamID, st, indexes[i])
			if err != nil {
				return nil, err
			}
			indexes[i] = x
		}
		h := newHoldings(db, bt.StreamID, st, bt.Limits, reads[i].live, reads[i].subjects)
		h.head = reads[i].oldest
		holds[i] = h
		chunkRows := bt.chunkRows()
		lastBefore := st.lastSeq
		var newIDs []string
		var newIDSeqs []int64
		var ttls ttlRows
		for j := range bt.Msgs {
			if bt.Atomic && j > 0 && (r.Outcomes[j-1].Err != nil || r.Outcomes[j-1].Duplicate) {
				break
			}
			m := &bt.Msgs[j]
			if m.MsgID != "" && bt.DupWindow > 0 {
				if seq, dup := seen[m.MsgID]; dup {
					r.Outcomes[j] = Outcome{Seq: seq, Duplicate: true}
					continue
				}
			}
			earlier := r.Stored
			if bt.Atomic {
				if e := atomicExpect(bt.Msgs, j, st.lastSeq); e != nil {
					r.Outcomes[j] = Outcome{Err: e}
					break
				}
				// nats-server decides a batch's expectations on what the stream held before it.
				earlier = nil
			}
			if e, err := db.checkExpect(ctx, q, bt.StreamID, st, earlier, m); err != nil {
				return nil, err
			} else if e != nil {
				r.Outcomes[j] = Outcome{Err: e}
				continue
			}
			if refused, err := db.checkPurge(ctx, q, bt.StreamID, st, r.Stored, h, m); err != nil {
				return nil, err
			} else if refused != nil {
				r.Outcomes[j] = Outcome{Err: refused}
				continue
			}
			hdr, data, refused, err := derive(ctx, q, m, reads[i].last, h)
			if err != nil {
				return nil, err
			}
			if refused != nil {
				r.Outcomes[j] = Outcome{Err: refused}
				continue
			}
			if st.lastSeq >= MaxSeq {
				r.Outcomes[j] = Outcome{Err: ErrSeqExhausted}
				continue
			}
			size := MessageSize(st.memory, m.Subject, hdr, data)
			if !m.NoInterest {
				if e := h.admit(m.Subject, size); e != nil {
					r.Outcomes[j] = Outcome{Err: e}
					continue
				}
			}
			st.lastSeq++
			if ts > st.lastTS {
				st.lastTS = ts
			}
			st.lastMsgID = m.MsgID
			r.Outcomes[j] = Outcome{Seq: st.lastSeq}
			if m.MsgID != "" && bt.DupWindow > 0 {
				if seen == nil {
					seen = make(map[string]uint64)
				}
				seen[m.MsgID] = st.lastSeq
				newIDs = append(newIDs, m.MsgID)
				newIDSeqs = append(newIDSeqs, int64(st.lastSeq))
			}
			if m.NoInterest {
				h.skip(st.lastSeq)
				// nats-server purges for a message it does not store too.
				h.purge(m.Purge)
				continue
			}
			msg := Message{Seq: st.lastSeq, TS: st.lastTS, Subject: m.Subject, Header: hdr, Data: data, cumBefore: st.cumBytes}
			if m.Derive != nil {
				r.Outcomes[j].Data = string(data)
				reads[i].last[m.Subject] = &msg
			}
			st.cumBytes += size
			r.Stored = append(r.Stored, msg)
			h.store(msg.Seq, m.Subject, size)
			h.rollup(m.Rollup, msg.Seq, m.Subject)
			h.purge(m.Purge)
			ttls.add(msg, m.TTL)
		}
		if bt.Atomic {
			if e := atomicRefusal(r.Outcomes); e != nil {
				refuseAtomic(r, st, befores[i], h, e)
				// What it derived from was not stored.
				reads[i].lasts = false
				continue
			}
		}
		if err := h.evictOld(ctx, q); err != nil {
			return nil, err
		}
		if err := h.settleFirst(ctx, q); err != nil {
			return nil, err
		}
		r.LastSeq = st.lastSeq
		if st.lastSeq == lastBefore {
			continue
		}
		// Split the stored rows over chunks, opening new ones as each fills. A new chunk's
		// table is created at once (rarely: once per ChunkRows messages), because the
		// pipeline below prepares its statements before running any of them.
		rest := r.Stored
		for len(rest) > 0 {
			if st.chunkRows >= chunkRows {
				st.chunk++
				st.chunkRows = 0
				if err := createChunk(ctx, q, bt.StreamID, st.chunk, rest[0].Seq); err != nil {
					return nil, err
				}
				opened = append(opened, openedChunk{bt.StreamID, chunkInfo{chunk: st.chunk, firstSeq: rest[0].Seq}})
			}
			n := min(int64(len(rest)), chunkRows-st.chunkRows)
			part := rest[:n]
			rest = rest[n:]
			st.chunkRows += n
			if len(part) >= copyThreshold {
				// COPY cannot ride in the pipeline; it runs before it, in the same transaction.
				id, chunk := bt.StreamID, st.chunk
				copies = append(copies, func() error {
					_, err := q.CopyFrom(ctx, pgx.Identifier{"jetgres", "msgs"},
						[]string{"stream_id", "chunk", "seq", "ts", "subject", "hdr", "data", "cum_before"}, copyRows(id, chunk, part))
					return err
				})
				continue
			}
			ins.add(bt.StreamID, st.chunk, part)
		}
		if n := len(r.Stored); n > 0 {
			doubts[i].probe, doubts[i].probed, doubts[i].chunk = r.Stored[n-1], true, st.chunk
		}
		if len(newIDs) > 0 {
			b.Queue(`SELECT jetgres.msg_ids_put($1, $2, $3, $4, $5)`,
				bt.StreamID, newIDs, newIDSeqs, ts, bt.DupWindow.Nanoseconds())
		}
		ttls.queue(b, bt.StreamID)
		if len(h.tombs) > 0 {
			seqs, sizes := tombColumns(h.tombs)
			b.Queue(`INSERT INTO jetgres.deleted (stream_id, seq, size)
				SELECT $1, s, z FROM unnest($2::bigint[], $3::bigint[]) AS t(s, z)`, bt.StreamID, seqs, sizes)
		}
		b.Queue(`UPDATE jetgres.stream_state SET first_seq = $2, last_seq = $3, last_ts = $4, cum_bytes = $5,
			msgs = $6, bytes = $7, chunk = $8, chunk_rows = $9, last_msg_id = $10 WHERE stream_id = $1`,
			bt.StreamID, st.firstSeq, st.lastSeq, st.lastTS, st.cumBytes, st.msgs, st.bytes, st.chunk, st.chunkRows, st.lastMsgID)
	}
	for _, c := range copies {
		if err := c(); err != nil {
			return nil, err
		}
	}
	ins.queue(b)
	if ends.last != nil {
		ends.last(b, res)
	}
	b.Queue("COMMIT")
	// Round trip 2: insert, advance the state rows, commit.
	sendErr := q.SendBatch(ctx, b).Close()
	for i := range res {
		r, h := &res[i], holds[i]
		if r.Gone {
			continue
		}
		r.FirstSeq, r.Removed = h.st.firstSeq, h.removed
		for _, t := range h.tombs {
			if t.size > 0 {
				r.Tombstoned = append(r.Tombstoned, t.seq)
			}
		}
		if h.removed {
			r.Stored = slices.DeleteFunc(r.Stored, func(m Message) bool { return !h.live(m.Seq) })
		}
	}
	if sendErr != nil {
		for i := range doubts {
			doubts[i].res = res[i]
		}
		return nil, db.commitFailed(q, sendErr, true, doubts)
	}
	committed = true
	for _, o := range opened {
		db.chunks.add(o.streamID, o.info)
	}
	for i := range res {
		r, h := &res[i], holds[i]
		if r.Gone {
			db.tails.forget(r.StreamID)
			continue
		}
		db.tails.remember(r.StreamID, h.st)
		db.chunks.committed(r.StreamID, h.st.chunk, h.st.lastSeq)
		if reads[i].lasts {
			db.lasts.afterGeneral(r.StreamID, lasts[i], befores[i], h, deriveSubjects(batches[i]), reads[i].last)
		}
		if indexes[i] != nil {
			db.subjects.afterGeneral(r.StreamID, indexes[i], befores[i], h.st, h.tombs, batchSubjects(batches[i]), r.Stored)
		}
	}
	return res, nil
}

// prefetchFor is prefetch for one batch, looking at what this process last committed and
// sizing the batch only when a limit can evict.
func (db *DB) prefetchFor(bt AppendBatch) int {
	if !bt.Limits.evictsOld() {
		return prefetch(bt.Limits, tailState{}, false, 0, 0)
	}
	last, known := db.tails.get(bt.StreamID)
	n, nbytes := batchSize(bt, last.memory)
	return prefetch(bt.Limits, last, known, n, nbytes)
}

// batchReads is what the first round trip read for one batch.
type batchReads struct {
	dups     bool // queued: the batch's message ids
	subjects bool // queued: the live messages of its subjects
	head     int  // queued: this many of the stream's oldest messages
	lasts    bool // queued: the last live message of each subject the batch derives from

	seen   map[string]uint64
	live   []subjectRow
	oldest []liveRow
	last   map[string]*Message
}

type subjectRow struct {
	subject string
	row     liveRow
}

// readBatchReads reads the first round trip's results in the order they were queued, after
// the skip results of the statements that open the transaction.
func readBatchReads(br pgx.BatchResults, skip int, batches []AppendBatch, reads []batchReads) (map[int64]*lockedState, error) {
	if err := skipResults(br, skip); err != nil {
		return nil, err
	}
	states := make(map[int64]*lockedState, len(batches))
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id int64
		s := &lockedState{}
		if err := rows.Scan(&id, &s.firstSeq, &s.lastSeq, &s.lastTS, &s.cumBytes, &s.msgs, &s.bytes, &s.chunk, &s.chunkRows, &s.lastMsgID, &s.memory); err != nil {
			rows.Close()
			return nil, err
		}
		s.committedFirst = s.firstSeq
		states[id] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range reads {
		rd := &reads[i]
		if rd.dups {
			rows, err := br.Query()
			if err != nil {
				return nil, err
			}
			rd.seen = make(map[string]uint64)
			for rows.Next() {
				var id string
				var seq uint64
				if err := rows.Scan(&id, &seq); err != nil {
					rows.Close()
					return nil, err
				}
				rd.seen[id] = seq
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, err
			}
		}
		if rd.subjects {
			rows, err := br.Query()
			if err != nil {
				return nil, err
			}
			rd.live, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (subjectRow, error) {
				var sr subjectRow
				err := r.Scan(&sr.subject, &sr.row.seq, &sr.row.size)
				return sr, err
			})
			if err != nil {
				return nil, err
			}
			slices.SortFunc(rd.live, func(a, b subjectRow) int { return cmp.Compare(a.row.seq, b.row.seq) })
		}
		if rd.head > 0 {
			rows, err := br.Query()
			if err != nil {
				return nil, err
			}
			if rd.oldest, err = pgx.CollectRows(rows, scanLiveRow); err != nil {
				return nil, err
			}
		}
		if rd.lasts {
			if rd.last, err = readLasts(br); err != nil {
				return nil, err
			}
		}
	}
	return states, nil
}

// rollsUpSubject reports whether a message of the batch rolls up its subject or purges
// another, which needs all the live rows of the batch's subjects.
func rollsUpSubject(b AppendBatch) bool {
	for i := range b.Msgs {
		if b.Msgs[i].Rollup == RollupSubject || b.Msgs[i].Purge != "" {
			return true
		}
	}
	return false
}

// batchSubjects lists the distinct subjects of the messages a batch may store, and of those
// they purge.
func batchSubjects(b AppendBatch) []string {
	seen := make(map[string]bool)
	var out []string
	for _, m := range b.Msgs {
		if !m.NoInterest && !seen[m.Subject] {
			seen[m.Subject] = true
			out = append(out, m.Subject)
		}
		if m.Purge != "" && !seen[m.Purge] {
			seen[m.Purge] = true
			out = append(out, m.Purge)
		}
	}
	return out
}

// batchSize is how many messages a batch may store and their stored bytes, counted as a
// memory stream's when memory.
func batchSize(b AppendBatch, memory bool) (n int, bytes uint64) {
	for _, m := range b.Msgs {
		if !m.NoInterest {
			n++
			bytes += MessageSize(memory, m.Subject, m.Header, m.Data)
		}
	}
	return n, bytes
}

type openedChunk struct {
	streamID int64
	info     chunkInfo
}

func batchMsgIDs(b AppendBatch) []string {
	var ids []string
	for _, m := range b.Msgs {
		if m.MsgID != "" {
			ids = append(ids, m.MsgID)
		}
	}
	return ids
}

// checkExpect evaluates a message's Nats-Expected-* headers against the locked state and
// the messages already accepted earlier in this batch.
func (db *DB) checkExpect(ctx context.Context, q querier, streamID int64, st *lockedState, earlier []Message, m *AppendMsg) (*ExpectError, error) {
	if m.ExpectLastSeq != nil && *m.ExpectLastSeq != st.lastSeq {
		return &ExpectError{Kind: ExpectLastSeqKind, LastSeq: st.lastSeq}, nil
	}
	if m.ExpectLastMsgID != "" && m.ExpectLastMsgID != st.lastMsgID {
		return &ExpectError{Kind: ExpectLastMsgIDKind, LastID: st.lastMsgID}, nil
	}
	if m.ExpectLastSubjSeq == nil {
		return nil, nil
	}
	filter := m.ExpectLastSubjFilter
	if filter == "" {
		filter = m.Subject
	}
	var last uint64
	for i := len(earlier) - 1; i >= 0; i-- {
		if SubjectMatches(filter, earlier[i].Subject) {
			last = earlier[i].Seq
			break
		}
	}
	if last == 0 {
		msg, err := db.lastMatching(ctx, q, streamID, filter, st.committedFirst, st.lastSeq)
		if err != nil {
			return nil, err
		}
		if msg != nil {
			last = msg.Seq
		}
	}
	if last != *m.ExpectLastSubjSeq {
		return &ExpectError{Kind: ExpectLastSubjSeqKind, LastSeq: last}, nil
	}
	return nil, nil
}

// rowsInsert gathers the rows a transaction inserts, of any streams and chunks, into one
// statement.
type rowsInsert struct {
	streams, chunks []int64
	msgs            []Message
}

func (r *rowsInsert) add(streamID, chunk int64, msgs []Message) {
	for range msgs {
		r.streams = append(r.streams, streamID)
		r.chunks = append(r.chunks, chunk)
	}
	r.msgs = append(r.msgs, msgs...)
}

func (r *rowsInsert) queue(b *pgx.Batch) {
	if len(r.msgs) == 0 {
		return
	}
	seqs, tss, subjects, hdrs, datas, cums := insertColumns(r.msgs)
	b.Queue(`INSERT INTO jetgres.msgs (stream_id, chunk, seq, ts, subject, hdr, data, cum_before)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::bytea[], $7::bytea[], $8::bigint[])`,
		r.streams, r.chunks, seqs, tss, subjects, hdrs, datas, cums)
}

// tombColumns lays tombstoned rows out as the column arrays an unnest insert into
// jetgres.deleted takes.
func tombColumns(tombs []liveRow) (seqs, sizes []int64) {
	seqs, sizes = make([]int64, len(tombs)), make([]int64, len(tombs))
	for i, t := range tombs {
		seqs[i], sizes[i] = int64(t.seq), int64(t.size)
	}
	return seqs, sizes
}

// insertColumns lays msgs out as the column arrays an unnest insert takes.
func insertColumns(msgs []Message) (seqs, tss []int64, subjects []string, hdrs, datas [][]byte, cums []int64) {
	seqs = make([]int64, len(msgs))
	tss = make([]int64, len(msgs))
	subjects = make([]string, len(msgs))
	hdrs = make([][]byte, len(msgs))
	datas = make([][]byte, len(msgs))
	cums = make([]int64, len(msgs))
	for i, m := range msgs {
		seqs[i], tss[i], subjects[i], hdrs[i], datas[i], cums[i] = int64(m.Seq), m.TS, m.Subject, m.Header, storedData(m.Data), int64(m.cumBefore)
	}
	return seqs, tss, subjects, hdrs, datas, cums
}

func copyRows(streamID, chunk int64, msgs []Message) pgx.CopyFromSource {
	return pgx.CopyFromSlice(len(msgs), func(i int) ([]any, error) {
		return append([]any{streamID, chunk}, msgs[i].columns()...), nil
	})
}
