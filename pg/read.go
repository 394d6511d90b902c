package pg

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
func (db *DB) readRange(ctx context.Context, q querier, p ReadParams, filters []string) (out []Message, through uint64, err error) {
	chunks, err := db.chunks.list(ctx, q, p.StreamID, p.UpTo)
	if err != nil {
		return nil, 0, err
	}
	if len(chunks) == 0 {
		return nil, p.UpTo, nil
	}
	// Start at the newest chunk that begins at or before From.
	start := max(sort.Search(len(chunks), func(i int) bool { return chunks[i].firstSeq > p.From })-1, 0)
	cond, arg := subjectCond(filters, 7)
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
		if out == nil {
			// The first window's array takes the result in place: each message is copied
			// out of it before its slot can be written, at the same index or a lower one.
			// Growing the result from nil instead allocated and copied it anew at every
			// doubling: more than half of the bytes a read allocated.
			out = msgs[:0]
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
func readWindow(ctx context.Context, q querier, streamID, chunk int64, from, end, size uint64, limit int, cond string, arg any) ([]Message, uint64, error) {
	if cond == "" {
		msgs, hi, err := readPlainWindow(ctx, q, streamID, chunk, from, end, size, limit)
		if err != nil || len(msgs) > 0 {
			return msgs, hi, err
		}
		// Nothing live in [from, hi]: the stream's first sequence may lie beyond it, and
		// the window then starts there, which only the general form finds out.
	}
	args := []any{customPlan, windowFormats, streamID, int64(from), int64(end), int64(size), limit, chunk}
	if arg != nil {
		args = append(args, arg)
	}
	// The window ends at lo+size-1 or at end, whichever comes first, computed so that it
	// cannot overflow bigint near the largest sequence.
	//
	// Most windows hold no tombstone: one probe of the tombstone index for the whole window
	// spares the probe per row, which was half of what the read cost PostgreSQL.
	rows, err := q.Query(ctx, `SELECT b.lo, b.hi, m.seq, m.ts, m.subject, m.hdr, m.data, m.cum_before
		FROM (SELECT lo, lo + LEAST($4::bigint - 1, $3::bigint - lo) AS hi
			FROM (SELECT GREATEST($2::bigint, first_seq) AS lo FROM jetgres.stream_state WHERE stream_id = $1) f) w
		CROSS JOIN LATERAL (SELECT w.lo, w.hi,
			EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq >= w.lo AND d.seq <= w.hi) AS dels) b
		LEFT JOIN LATERAL (SELECT seq, ts, subject, hdr, data, cum_before FROM jetgres.msgs m
			WHERE m.stream_id = $1 AND m.chunk = $6 AND seq >= b.lo AND seq <= b.hi AND (NOT b.dels OR `+notTombstoned("$1")+`)`+cond+` ORDER BY seq LIMIT $5) m ON true`, args...)
	if err != nil {
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
	return windowResult(rows.Err(), msgs, hi, limit)
}

// windowResult ends a window read of either form once its rows are read: rowsErr is the
// rows' error, hi the sequence through which the read looked.
func windowResult(rowsErr error, msgs []Message, hi uint64, limit int) ([]Message, uint64, error) {
	if rowsErr != nil {
		return nil, 0, rowsErr
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

// readPlainWindow is readWindow for a read without a subject filter, in the form that
// PostgreSQL runs fastest: the window [from, min(end, from+size-1)] is fixed by the caller,
// and the stream's first sequence and the window's tombstones are one-time subqueries
// rather than a join. On a fresh chunk it reads 1.3 to 1.6 times as many rows a second as
// the general form, whose window follows the first sequence. It reports the window's end
// as the sequence through which it looked; a caller that gets no message cannot tell a
// window of tombstones from one the first sequence passed, and asks the general form.
func readPlainWindow(ctx context.Context, q querier, streamID, chunk int64, from, end, size uint64, limit int) ([]Message, uint64, error) {
	hi := end
	if size-1 < end-from {
		hi = from + size - 1
	}
	rows, err := q.Query(ctx, `SELECT seq, ts, subject, hdr, data, cum_before FROM jetgres.msgs m
		WHERE m.stream_id = $1 AND m.chunk = $5 AND seq >= $2 AND seq <= $3 AND seq >= (SELECT first_seq FROM jetgres.stream_state WHERE stream_id = $1)
			AND (NOT (SELECT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq >= $2 AND d.seq <= $3))
				OR `+notTombstoned("$1")+`)
		ORDER BY seq LIMIT $4`, customPlan, plainFormats, streamID, int64(from), int64(hi), limit, chunk)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var msgs []Message
	var a arena
	raw, decided := false, false
	for rows.Next() {
		if !decided {
			raw, decided = plainBinary(rows.FieldDescriptions()), true
		}
		var m Message
		var err error
		if raw {
			m, err = a.plainRow(rows.RawValues())
		} else {
			m, err = scanPlainRow(rows)
		}
		if err != nil {
			return nil, 0, err
		}
		if msgs == nil {
			msgs = make([]Message, 0, min(uint64(limit), hi-from+1))
		}
		msgs = append(msgs, m)
	}
	return windowResult(rows.Err(), msgs, hi, limit)
}

// customPlan makes PostgreSQL plan a read or get of jetgres.msgs for its parameters at each
// call (an unnamed statement, its description cached by pgx), so that the planner opens the
// one partition the stream and chunk name. A named prepared statement may switch to a
// generic plan after five calls, and a generic plan of jetgres.msgs locks and initialises
// every partition at each execution: with 10,000 chunk tables, a read measured 11 s against
// 0.2 ms planned for its parameters (PostgreSQL 15).
var customPlan = pgx.QueryExecModeCacheDescribe

// plainFormats asks for every column of a plain window read in binary: seq, ts, subject,
// hdr, data, cum_before.
var plainFormats = pgx.QueryResultFormats{1, 1, 1, 1, 1, 1}

func plainBinary(fds []pgconn.FieldDescription) bool {
	for _, fd := range fds {
		if fd.Format != pgx.BinaryFormatCode {
			return false
		}
	}
	return len(fds) == len(plainFormats)
}

// plainRow decodes one row of a plain window read from its binary columns.
func (a *arena) plainRow(v [][]byte) (m Message, err error) {
	if len(v) != len(plainFormats) {
		return m, fmt.Errorf("window read: %d columns, want %d", len(v), len(plainFormats))
	}
	var ints [3]int64 // seq, ts, cum_before
	for i, col := range [3]int{0, 1, 5} {
		if ints[i], err = binaryInt8(v[col]); err != nil {
			return m, fmt.Errorf("window read, column %d: %w", col, err)
		}
	}
	return Message{Seq: uint64(ints[0]), TS: ints[1], Subject: a.subject(v[2]),
		Header: a.bytes(v[3]), Data: a.bytes(v[4]), cumBefore: uint64(ints[2])}, nil
}

// scanPlainRow is plainRow for text columns.
func scanPlainRow(rows pgx.Rows) (m Message, err error) {
	var seq, cum int64
	if err := rows.Scan(&seq, &m.TS, &m.Subject, &m.Header, &m.Data, &cum); err != nil {
		return m, err
	}
	m.Seq, m.cumBefore = uint64(seq), uint64(cum)
	return m, nil
}

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
