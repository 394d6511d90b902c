package pg

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ChunkRowsDefault is how many messages a chunk table holds before appends move on to a new
// one. Retention frees space one whole chunk at a time, so this is also the granularity at
// which a consumed stream gives its disk back.
const ChunkRowsDefault = 1 << 16

// Message is one stored message.
type Message struct {
	Seq     uint64
	TS      int64 // unix ns
	Subject string
	Header  []byte
	Data    []byte

	cumBefore uint64
}

// Size is the message's stored size as JetStream accounts it: subject, headers, payload
// and a fixed per-message overhead.
func (m *Message) Size() uint64 { return MessageSize(m.Subject, m.Header, m.Data) }

// MessageSize is the stored size of a message with these parts: the size of its record in
// JetStream's file store (the default storage, and the one streams report), so that bytes
// and max_bytes mean the same here as there. sqlSize is the same in SQL.
func MessageSize(subject string, hdr, data []byte) uint64 {
	if len(hdr) == 0 {
		return uint64(30 + len(subject) + len(data))
	}
	return uint64(34 + len(subject) + len(hdr) + len(data))
}

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
}

// Outcome is what happened to one AppendMsg. Exactly one of Stored, Duplicate or Err holds.
type Outcome struct {
	Seq       uint64 // the stored sequence, or the original's for a duplicate
	Duplicate bool
	Err       error // an *ExpectError when an expectation failed, a *LimitError when a limit refused it
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
}

// copyThreshold is the batch size from which COPY beats a multi-row INSERT.
const copyThreshold = 64

type lockedState struct {
	firstSeq, lastSeq, cumBytes uint64
	msgs, bytes                 uint64
	lastTS                      int64
	chunk, chunkRows            int64
	lastMsgID                   string
	// committedFirst is firstSeq as the row was read: what the batch evicts is still there
	// for the statements of this transaction.
	committedFirst uint64
}

// Append stores the batches of one or more streams in one transaction: lock each stream's
// state row (in stream id order, so concurrent multi-stream flushes cannot deadlock),
// decide de-duplication, expectations and limits, allocate dense sequences, insert, move the
// first sequence past what discard-old limits evict and tombstone what per-subject limits
// replace, commit. ts is
// the store time given to every message. The returned rtt is the database round trip for
// the flow limiter, recorded whatever the outcome.
func (db *DB) Append(ctx context.Context, batches []AppendBatch, ts int64) ([]AppendResult, time.Duration, error) {
	sort.Slice(batches, func(i, j int) bool { return batches[i].StreamID < batches[j].StreamID })
	var results []AppendResult
	rtt, err := db.Hot(ctx, func(ctx context.Context, q Querier) error {
		done, rest, err := db.appendFast(ctx, q, batches, ts)
		if err != nil {
			// The fast path's implicit transaction rolled back as a whole (a collision
			// its guards could not see, say); the general path decides afresh.
			done, rest = nil, batches
		}
		if len(rest) > 0 {
			slow, err := db.appendTx(ctx, q, rest, ts)
			if err != nil {
				return err
			}
			done = append(done, slow...)
		}
		results = done
		return nil
	})
	if err != nil {
		return nil, rtt, fmt.Errorf("pg: append: %w", err)
	}
	return results, rtt, nil
}

func (db *DB) appendTx(ctx context.Context, q Querier, batches []AppendBatch, ts int64) (res []AppendResult, err error) {
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
	b.Queue("BEGIN")
	b.Queue(`SELECT stream_id, first_seq, last_seq, last_ts, cum_bytes, msgs, bytes, chunk, chunk_rows, last_msg_id
		FROM jetgres.stream_state WHERE stream_id = ANY($1) ORDER BY stream_id FOR UPDATE`, ids)
	reads := make([]batchReads, len(batches))
	for i, bt := range batches {
		rd := &reads[i]
		if msgIDs := batchMsgIDs(bt); len(msgIDs) > 0 && bt.DupWindow > 0 {
			b.Queue(`SELECT msg_id, seq FROM jetgres.msg_ids WHERE stream_id = $1 AND msg_id = ANY($2) AND ts > $3`,
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
	}
	br := q.SendBatch(ctx, b)
	states, err := readBatchReads(br, batches, reads)
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
	var opened []openedChunk
	holds := make([]*holdings, len(batches))
	for i, bt := range batches {
		st, ok := states[bt.StreamID]
		if !ok {
			return nil, fmt.Errorf("stream %d: %w", bt.StreamID, ErrNotFound)
		}
		r := &res[i]
		r.StreamID = bt.StreamID
		r.Outcomes = make([]Outcome, len(bt.Msgs))
		r.Stored = make([]Message, 0, len(bt.Msgs))
		seen := reads[i].seen
		h := newHoldings(db, bt.StreamID, st, bt.Limits, reads[i].live, reads[i].subjects)
		h.head = reads[i].oldest
		holds[i] = h
		chunkRows := bt.chunkRows()
		lastBefore := st.lastSeq
		var newIDs []string
		var newIDSeqs []int64
		for j := range bt.Msgs {
			m := &bt.Msgs[j]
			if m.MsgID != "" && bt.DupWindow > 0 {
				if seq, dup := seen[m.MsgID]; dup {
					r.Outcomes[j] = Outcome{Seq: seq, Duplicate: true}
					continue
				}
			}
			if e, err := db.checkExpect(ctx, q, bt.StreamID, st, r.Stored, m); err != nil {
				return nil, err
			} else if e != nil {
				r.Outcomes[j] = Outcome{Err: e}
				continue
			}
			size := MessageSize(m.Subject, m.Header, m.Data)
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
				continue
			}
			msg := Message{Seq: st.lastSeq, TS: st.lastTS, Subject: m.Subject, Header: m.Header, Data: m.Data, cumBefore: st.cumBytes}
			st.cumBytes += size
			r.Stored = append(r.Stored, msg)
			h.store(msg.Seq, m.Subject, size)
			h.rollup(m.Rollup, msg.Seq, m.Subject)
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
				chunk := st.chunk
				copies = append(copies, func() error {
					_, err := q.CopyFrom(ctx, pgx.Identifier{"jetgres", chunkName(bt.StreamID, chunk)},
						[]string{"seq", "ts", "subject", "hdr", "data", "cum_before"}, copyRows(part))
					return err
				})
				continue
			}
			queueInsert(b, chunkTable(bt.StreamID, st.chunk), part)
		}
		if len(newIDs) > 0 {
			b.Queue(`INSERT INTO jetgres.msg_ids (stream_id, msg_id, seq, ts)
				SELECT $1, id, seq, $4 FROM unnest($2::text[], $3::bigint[]) AS u(id, seq)
				ON CONFLICT (stream_id, msg_id) DO UPDATE SET seq = excluded.seq, ts = excluded.ts`,
				bt.StreamID, newIDs, newIDSeqs, ts)
		}
		if len(h.tombs) > 0 {
			seqs, sizes := make([]int64, len(h.tombs)), make([]int64, len(h.tombs))
			for k, t := range h.tombs {
				seqs[k], sizes[k] = int64(t.seq), int64(t.size)
			}
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
	b.Queue("COMMIT")
	// Round trip 2: insert, advance the state rows, commit.
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	committed = true
	for i := range res {
		db.tails.remember(res[i].StreamID, holds[i].st)
	}
	for _, o := range opened {
		db.chunks.add(o.streamID, o.info)
	}
	for i := range res {
		db.chunks.committed(res[i].StreamID, holds[i].st.chunk, holds[i].st.lastSeq)
	}
	for i := range res {
		r, h := &res[i], holds[i]
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
	return res, nil
}

// prefetchFor is prefetch for one batch, looking at what this process last committed and
// sizing the batch only when a limit can evict.
func (db *DB) prefetchFor(bt AppendBatch) int {
	if !bt.Limits.evictsOld() {
		return prefetch(bt.Limits, tailState{}, false, 0, 0)
	}
	last, known := db.tails.get(bt.StreamID)
	n, nbytes := batchSize(bt)
	return prefetch(bt.Limits, last, known, n, nbytes)
}

// batchReads is what the first round trip read for one batch.
type batchReads struct {
	dups     bool // queued: the batch's message ids
	subjects bool // queued: the live messages of its subjects
	head     int  // queued: this many of the stream's oldest messages

	seen   map[string]uint64
	live   []subjectRow
	oldest []liveRow
}

type subjectRow struct {
	subject string
	row     liveRow
}

// readBatchReads reads the first round trip's results in the order they were queued.
func readBatchReads(br pgx.BatchResults, batches []AppendBatch, reads []batchReads) (map[int64]*lockedState, error) {
	if _, err := br.Exec(); err != nil {
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
		if err := rows.Scan(&id, &s.firstSeq, &s.lastSeq, &s.lastTS, &s.cumBytes, &s.msgs, &s.bytes, &s.chunk, &s.chunkRows, &s.lastMsgID); err != nil {
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
	}
	return states, nil
}

// rollsUpSubject reports whether a message of the batch rolls up its subject, which needs
// the live rows of the batch's subjects.
func rollsUpSubject(b AppendBatch) bool {
	for i := range b.Msgs {
		if b.Msgs[i].Rollup == RollupSubject {
			return true
		}
	}
	return false
}

// batchSubjects lists the distinct subjects of the messages a batch may store.
func batchSubjects(b AppendBatch) []string {
	seen := make(map[string]bool)
	var out []string
	for _, m := range b.Msgs {
		if !m.NoInterest && !seen[m.Subject] {
			seen[m.Subject] = true
			out = append(out, m.Subject)
		}
	}
	return out
}

// batchSize is how many messages a batch may store and their stored bytes.
func batchSize(b AppendBatch) (n int, bytes uint64) {
	for _, m := range b.Msgs {
		if !m.NoInterest {
			n++
			bytes += MessageSize(m.Subject, m.Header, m.Data)
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
func (db *DB) checkExpect(ctx context.Context, q Querier, streamID int64, st *lockedState, earlier []Message, m *AppendMsg) (*ExpectError, error) {
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

func queueInsert(b *pgx.Batch, table string, msgs []Message) {
	seqs, tss, subjects, hdrs, datas, cums := insertColumns(msgs)
	b.Queue(`INSERT INTO `+table+` (seq, ts, subject, hdr, data, cum_before)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bytea[], $5::bytea[], $6::bigint[])`,
		seqs, tss, subjects, hdrs, datas, cums)
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

func copyRows(msgs []Message) pgx.CopyFromSource {
	return pgx.CopyFromSlice(len(msgs), func(i int) ([]any, error) {
		return msgs[i].columns(), nil
	})
}

// columns is m as a row of a chunk table: seq, ts, subject, hdr, data, cum_before.
func (m *Message) columns() []any {
	return []any{int64(m.Seq), m.TS, m.Subject, m.Header, storedData(m.Data), int64(m.cumBefore)}
}

// storedData is a payload as its NOT NULL column takes it: no payload is an empty one.
func storedData(data []byte) []byte {
	if data == nil {
		return []byte{}
	}
	return data
}

func chunkName(streamID, chunk int64) string { return fmt.Sprintf("msgs_%d_%d", streamID, chunk) }

// chunkTable is the quoted, schema-qualified name of a chunk table. Only numbers go into it.
func chunkTable(streamID, chunk int64) string {
	return pgx.Identifier{"jetgres", chunkName(streamID, chunk)}.Sanitize()
}

func createChunk(ctx context.Context, q Querier, streamID, chunk int64, firstSeq uint64) error {
	for _, ddl := range chunkDDL(streamID, chunk) {
		if _, err := q.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create chunk %d: %w", chunk, err)
		}
	}
	_, err := q.Exec(ctx, `INSERT INTO jetgres.chunks (stream_id, chunk, first_seq) VALUES ($1, $2, $3)`, streamID, chunk, int64(firstSeq))
	return err
}

// chunkDDL creates a chunk table: one statement each, as a pipeline takes them.
//
// Subjects are compared byte by byte, as NATS does, whatever the database's collation: under
// a linguistic collation (en_US and the like, the default of many databases jetgres is
// pointed at) every comparison of the subject index costs a collation lookup, and an
// anchored pattern such as a wildcard filter's cannot use the index at all.
func chunkDDL(streamID, chunk int64) []string {
	t := chunkTable(streamID, chunk)
	return []string{`CREATE TABLE ` + t + ` (
		seq        bigint PRIMARY KEY,
		ts         bigint NOT NULL,
		subject    text   COLLATE "C" NOT NULL,
		hdr        bytea,
		data       bytea  NOT NULL,
		cum_before bigint NOT NULL
	)`, `CREATE INDEX ON ` + t + ` (subject, seq)`}
}

// ReadParams selects a range of a stream.
type ReadParams struct {
	StreamID int64
	From     uint64 // first sequence wanted
	UpTo     uint64 // last committed sequence known to the caller; reading stops there
	MaxMsgs  int
	MaxBytes int // 0 for no bound; at least one message is returned
	// BytesThrough counts MaxBytes as a direct get does: the subject, header and data of
	// each message, stopping after the message that reaches the bound instead of before
	// one that would pass it (a pull request's rule, by stored size).
	BytesThrough bool
}

// readRange returns up to p.MaxMsgs live messages from [p.From, p.UpTo] whose subject
// matches any of filters (all of them when filters is empty), and the sequence through which
// it looked: nothing between the returned messages and through matched.
func (db *DB) readRange(ctx context.Context, q Querier, p ReadParams, filters []string) (out []Message, through uint64, err error) {
	chunks, err := db.chunks.list(ctx, q, p.StreamID, p.UpTo)
	if err != nil {
		return nil, 0, err
	}
	if len(chunks) == 0 {
		return nil, p.UpTo, nil
	}
	// Start at the newest chunk that begins at or before From.
	start := max(sort.Search(len(chunks), func(i int) bool { return chunks[i].firstSeq > p.From })-1, 0)
	cond, arg := subjectCond(filters, 6)
	bytes := 0
	from := p.From
	w := window{filtered: cond != ""}
	for k := start; k < len(chunks) && from <= p.UpTo && len(out) < p.MaxMsgs; {
		from = max(from, chunks[k].firstSeq)
		end := p.UpTo
		if k+1 < len(chunks) {
			end = min(end, chunks[k+1].firstSeq-1)
		}
		want := p.MaxMsgs - len(out)
		msgs, hi, err := readWindow(ctx, q, p.StreamID, chunks[k].chunk, from, end, w.size(want), want, cond, arg)
		if err != nil {
			return nil, 0, err
		}
		for _, m := range msgs {
			if p.BytesThrough {
				out = append(out, m)
				if bytes += len(m.Subject) + len(m.Header) + len(m.Data); p.MaxBytes > 0 && bytes >= p.MaxBytes {
					return out, m.Seq, nil
				}
				continue
			}
			if p.MaxBytes > 0 && len(out) > 0 && bytes+int(m.Size()) > p.MaxBytes {
				return out, out[len(out)-1].Seq, nil
			}
			bytes += int(m.Size())
			out = append(out, m)
		}
		if len(out) == p.MaxMsgs {
			return out, out[len(out)-1].Seq, nil
		}
		if hi >= from {
			w.saw(len(msgs), hi-from+1)
		}
		from = max(from, hi+1)
		if from > end {
			k++
		}
	}
	return out, min(from-1, p.UpTo), nil
}

// window sizes the windows of sequences a read looks through, one query each. A chunk holds
// at most one row per sequence (the primary key), so a window of n sequences holds at most n
// rows: however PostgreSQL plans a query, it touches no more rows than its window. Without
// that bound, on a chunk that has not been analyzed yet (every chunk while it fills) the
// planner estimates a range to hold a few hundred rows, takes a bitmap scan of all of it and
// sorts it: 50 to 77 ms for 1,000 rows of a 64,000-row chunk, against 1 to 3 ms for the
// window.
//
// An unfiltered read of n messages starts with a window of n (at least minWindow), since
// rows are only ever tombstoned or dropped with their chunk and most sequences have one. A
// window that comes back mostly tombstoned, or mostly of other subjects, makes the next one
// larger, so that a long run of them costs a few round trips, not one per batch.
type window struct {
	filtered bool
	shift    uint
}

const (
	// minWindow is the smallest window: a read of one message behind a few tombstones
	// should not take a round trip for each.
	minWindow = 64
	// minFilteredWindow is where a filtered read's windows start: which share of the rows
	// its filter matches is not known.
	minFilteredWindow = 256
	// maxWindow is the largest window: the default chunk size.
	maxWindow = 1 << 16
)

func (w *window) size(want int) uint64 {
	n := min(max(uint64(want), minWindow), maxWindow)
	if w.filtered {
		n = max(n, minFilteredWindow)
	}
	return min(n<<w.shift, maxWindow)
}

// saw records a window of span sequences that held live matching rows.
func (w *window) saw(live int, span uint64) {
	if uint64(live)*2 >= span || w.shift >= 16 {
		return
	}
	w.shift++
	if w.filtered {
		w.shift++
	}
}

// readWindow reads the live rows of one chunk in [max(from, first), min(end, max(from, first)
// + size - 1)], first being the stream's first sequence, at most limit of them. It returns
// them and the sequence through which it looked: the window's last, the last row's when it
// returns limit rows, or first-1 when the stream's first sequence lies beyond the window.
func readWindow(ctx context.Context, q Querier, streamID, chunk int64, from, end, size uint64, limit int, cond string, arg any) ([]Message, uint64, error) {
	args := []any{windowFormats, streamID, int64(from), int64(end), int64(size), limit}
	if arg != nil {
		args = append(args, arg)
	}
	// Most windows hold no tombstone: one probe of the tombstone index for the whole window
	// spares the probe per row, which was half of what the read cost PostgreSQL.
	rows, err := q.Query(ctx, `SELECT b.lo, b.hi, m.seq, m.ts, m.subject, m.hdr, m.data, m.cum_before
		FROM (SELECT GREATEST($2::bigint, first_seq) AS lo, LEAST($3::bigint, GREATEST($2::bigint, first_seq) + $4::bigint - 1) AS hi
			FROM jetgres.stream_state WHERE stream_id = $1) w
		CROSS JOIN LATERAL (SELECT w.lo, w.hi,
			EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq >= w.lo AND d.seq <= w.hi) AS dels) b
		LEFT JOIN LATERAL (SELECT seq, ts, subject, hdr, data, cum_before FROM `+chunkTable(streamID, chunk)+` m
			WHERE seq >= b.lo AND seq <= b.hi AND (NOT b.dels OR `+notTombstoned("$1")+`)`+cond+` ORDER BY seq LIMIT $5) m ON true`, args...)
	if err != nil {
		if isUndefinedTable(err) {
			// Retention dropped the chunk: everything in it is gone.
			return nil, end, nil
		}
		return nil, 0, err
	}
	defer rows.Close()
	var msgs []Message
	var a arena
	// Only the exec modes that describe the statement honour windowFormats; with
	// default_query_exec_mode=exec or simple_protocol in the URL (as behind a transaction
	// pooler) the columns come back as text, and pgx's Scan decodes them.
	raw, decided := false, false
	hi := end
	for rows.Next() {
		if !decided {
			// Known once a row arrived: the field descriptions may come with it.
			raw, decided = allBinary(rows.FieldDescriptions()), true
		}
		var lo, last int64
		var m Message
		var ok bool
		var err error
		if raw {
			lo, last, m, ok, err = a.windowRow(rows.RawValues())
		} else {
			lo, last, m, ok, err = scanWindowRow(rows)
		}
		if err != nil {
			return nil, 0, err
		}
		// A window the stream's first sequence has passed ends where that begins.
		hi = uint64(max(last, lo-1))
		if !ok {
			continue
		}
		if msgs == nil {
			msgs = make([]Message, 0, min(uint64(limit), size))
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		if isUndefinedTable(err) {
			return nil, end, nil
		}
		return nil, 0, err
	}
	// A join of one row keeps the order of the rows joined to it; sorting the whole result
	// in PostgreSQL to make sure of that would cost more than the read.
	if !slices.IsSortedFunc(msgs, bySeq) {
		slices.SortFunc(msgs, bySeq)
	}
	if len(msgs) == limit {
		hi = msgs[len(msgs)-1].Seq
	}
	return msgs, hi, nil
}

func bySeq(a, b Message) int { return cmp.Compare(a.Seq, b.Seq) }

// windowFormats asks for every column of a window read in binary, which readWindow decodes
// from the wire itself: lo, hi, seq, ts, subject, hdr, data, cum_before.
var windowFormats = pgx.QueryResultFormats{1, 1, 1, 1, 1, 1, 1, 1}

func allBinary(fds []pgconn.FieldDescription) bool {
	for _, fd := range fds {
		if fd.Format != pgx.BinaryFormatCode {
			return false
		}
	}
	return len(fds) == len(windowFormats)
}

// windowRow decodes one row of a window read from its binary columns. ok is false for the
// LEFT JOIN's row of nulls: the window held no message.
func (a *arena) windowRow(v [][]byte) (lo, hi int64, m Message, ok bool, err error) {
	if len(v) != len(windowFormats) {
		return 0, 0, m, false, fmt.Errorf("window read: %d columns, want %d", len(v), len(windowFormats))
	}
	var ints [5]int64 // lo, hi, seq, ts, cum_before
	for i, col := range [5]int{0, 1, 2, 3, 7} {
		if i >= 2 && v[2] == nil {
			break
		}
		if ints[i], err = binaryInt8(v[col]); err != nil {
			return 0, 0, m, false, fmt.Errorf("window read, column %d: %w", col, err)
		}
	}
	if v[2] == nil {
		return ints[0], ints[1], m, false, nil
	}
	m = Message{Seq: uint64(ints[2]), TS: ints[3], Subject: a.subject(v[4]),
		Header: a.bytes(v[5]), Data: a.bytes(v[6]), cumBefore: uint64(ints[4])}
	return ints[0], ints[1], m, true, nil
}

// scanWindowRow is windowRow for text columns.
func scanWindowRow(rows pgx.Rows) (lo, hi int64, m Message, ok bool, err error) {
	var seq, ts, cum *int64
	var subject *string
	if err := rows.Scan(&lo, &hi, &seq, &ts, &subject, &m.Header, &m.Data, &cum); err != nil {
		return 0, 0, m, false, err
	}
	if seq == nil {
		return lo, hi, m, false, nil
	}
	m.Seq, m.TS, m.Subject, m.cumBefore = uint64(*seq), *ts, *subject, uint64(*cum)
	return lo, hi, m, true, nil
}

// binaryInt8 decodes a bigint in PostgreSQL's binary format.
func binaryInt8(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("bigint of %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// arena holds the bytes of one read's messages in a few blocks of up to 64 KiB, where
// scanning each row cost an allocation per column: a consumer behind the tail cache reads
// every message it delivers this way. A message keeps its block alive; the messages of a
// read are delivered, or evicted from a tail cache, in order, so the blocks go in order too.
type arena struct {
	block       []byte
	lastSubject string // most reads see few subjects
}

const (
	arenaFirstBlock = 1 << 10
	arenaBlock      = 64 << 10
)

// bytes copies b into the arena; NULL stays nil.
func (a *arena) bytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) == 0 {
		return []byte{}
	}
	if len(b) > cap(a.block)-len(a.block) {
		// Blocks double from small, so that a read of one message (a direct get, a
		// subject's last) does not hold a block meant for a thousand.
		next := min(max(2*cap(a.block), arenaFirstBlock), arenaBlock)
		a.block = make([]byte, 0, max(next, len(b)))
	}
	n := len(a.block)
	a.block = append(a.block, b...)
	return a.block[n:len(a.block):len(a.block)]
}

// subject returns b as a string, the previous row's when they are equal.
func (a *arena) subject(b []byte) string {
	if a.lastSubject != string(b) {
		a.lastSubject = string(b)
	}
	return a.lastSubject
}

func scanMessage(r pgx.CollectableRow) (Message, error) {
	var m Message
	var seq, cum int64
	err := r.Scan(&seq, &m.TS, &m.Subject, &m.Header, &m.Data, &cum)
	m.Seq, m.cumBefore = uint64(seq), uint64(cum)
	return m, err
}

// streamBounds reads a stream's committed first and last sequence.
func streamBounds(ctx context.Context, q Querier, streamID int64) (first, last uint64, err error) {
	err = q.QueryRow(ctx, `SELECT first_seq, last_seq FROM jetgres.stream_state WHERE stream_id = $1`, streamID).Scan(&first, &last)
	return first, last, err
}

// GetMessage returns the message with sequence seq, or ErrNotFound.
func (db *DB) GetMessage(ctx context.Context, streamID int64, seq uint64) (*Message, error) {
	var m *Message
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
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
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
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
	err := db.Background(ctx, func(ctx context.Context, q Querier) error {
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
func (db *DB) messageAt(ctx context.Context, q Querier, streamID int64, from, upTo uint64) (*Message, error) {
	msgs, _, err := db.readRange(ctx, q, ReadParams{StreamID: streamID, From: from, UpTo: upTo, MaxMsgs: 1}, nil)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	return &msgs[0], nil
}

// lastMatching scans chunks newest first for the last live message in [first, upTo]
// matching filter.
func (db *DB) lastMatching(ctx context.Context, q Querier, streamID int64, filter string, first, upTo uint64) (*Message, error) {
	chunks, err := db.chunks.list(ctx, q, streamID, upTo)
	if err != nil {
		return nil, err
	}
	cond, arg := `subject = $1`, any(filter)
	if strings.ContainsAny(filter, "*>") {
		cond, arg = `subject ~ $1`, SubjectRegexp(filter)
	}
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

// SubjectRegexp turns a NATS subject filter into an anchored POSIX regular expression.
func SubjectRegexp(filter string) string {
	toks := strings.Split(filter, ".")
	var sb strings.Builder
	sb.WriteString("^")
	for i, t := range toks {
		if i > 0 {
			sb.WriteString(`\.`)
		}
		switch t {
		case "*":
			sb.WriteString(`[^.]+`)
		case ">":
			sb.WriteString(`.+`)
		default:
			sb.WriteString(regexp.QuoteMeta(t))
		}
	}
	sb.WriteString("$")
	return sb.String()
}

// SubjectMatches reports whether a literal subject matches a filter with wildcards.
func SubjectMatches(filter, subject string) bool {
	if filter == subject || filter == ">" {
		return true
	}
	for {
		ft, frest, fmore := strings.Cut(filter, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case ft == ">":
			return true
		case ft != "*" && ft != st:
			return false
		}
		if !fmore || !smore {
			return fmore == smore
		}
		filter, subject = frest, srest
	}
}

type chunkInfo struct {
	chunk    int64
	firstSeq uint64
}

// chunkCache remembers each stream's chunk list. Another replica may open a chunk we have
// not seen; a read that needs sequences beyond what the newest known chunk can explain
// reloads the list.
type chunkCache struct {
	mu     sync.Mutex
	byID   map[int64][]chunkInfo
	loaded map[int64]uint64 // the UpTo the list was loaded for
}

func (c *chunkCache) list(ctx context.Context, q Querier, streamID int64, upTo uint64) ([]chunkInfo, error) {
	c.mu.Lock()
	l, ok := c.byID[streamID]
	at := c.loaded[streamID]
	c.mu.Unlock()
	if ok && upTo <= at {
		return l, nil
	}
	rows, err := q.Query(ctx, `SELECT chunk, first_seq FROM jetgres.chunks WHERE stream_id = $1 ORDER BY chunk`, streamID)
	if err != nil {
		return nil, err
	}
	l, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (chunkInfo, error) {
		var ci chunkInfo
		var first int64
		err := r.Scan(&ci.chunk, &first)
		ci.firstSeq = uint64(first)
		return ci, err
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID == nil {
		c.byID, c.loaded = make(map[int64][]chunkInfo), make(map[int64]uint64)
	}
	c.byID[streamID] = l
	c.loaded[streamID] = upTo
	return l, nil
}

// committed records that this process committed a stream's sequences up to lastSeq, the
// newest of them in chunk. When the list ends with that chunk and has no gap (another
// replica may have opened a chunk this process never saw), it explains every sequence up to
// lastSeq, so reads up to there need not reload it: a read right after a local commit then
// costs no extra round trip.
func (c *chunkCache) committed(streamID, chunk int64, lastSeq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[streamID]
	if !ok || len(l) == 0 || l[len(l)-1].chunk != chunk || lastSeq <= c.loaded[streamID] {
		return
	}
	for i := 1; i < len(l); i++ {
		if l[i].chunk != l[i-1].chunk+1 {
			return
		}
	}
	c.loaded[streamID] = lastSeq
}

// add records a chunk this process opened, once its transaction has committed.
func (c *chunkCache) add(streamID int64, ci chunkInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[streamID]
	if !ok {
		return
	}
	if n := len(l); n > 0 && l[n-1].chunk >= ci.chunk {
		return
	}
	c.byID[streamID] = append(l, ci)
}

// dropped forgets a chunk the maintainer dropped.
func (c *chunkCache) dropped(streamID, chunk int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.byID[streamID]; ok {
		c.byID[streamID] = slices.DeleteFunc(slices.Clone(l), func(ci chunkInfo) bool { return ci.chunk == chunk })
	}
}

func (c *chunkCache) forget(streamID int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.byID, streamID)
	delete(c.loaded, streamID)
}

func isUndefinedTable(err error) bool { return hasSQLState(err, "42P01") }

// hasSQLState reports whether err is a PostgreSQL error with this SQLSTATE code.
func hasSQLState(err error, code string) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == code
}
