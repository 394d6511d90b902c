package pg

import (
	"context"
)

// Limits are the stream limits the append transaction enforces, the way JetStream's file
// store does: with DiscardNew a publish that would go over max_msgs or max_bytes is refused,
// otherwise the oldest messages make room; a subject over max_msgs_per_subject loses its
// oldest message under either policy, unless DiscardNewPer refuses the publish instead.
// Zero or less means no limit.
type Limits struct {
	MaxMsgs       int64
	MaxBytes      int64
	MaxMsgsPer    int64
	DiscardNew    bool
	DiscardNewPer bool
}

func (l Limits) evictsOld() bool { return !l.DiscardNew && (l.MaxMsgs > 0 || l.MaxBytes > 0) }

// LimitError is the outcome of a publish that a discard-new limit refused.
type LimitError struct {
	Kind LimitKind
}

// LimitKind names the limit that refused a publish.
type LimitKind int

const (
	LimitMsgs LimitKind = iota + 1
	LimitBytes
	LimitMsgsPerSubject
)

// Error is JetStream's text for the same refusal.
func (e *LimitError) Error() string {
	switch e.Kind {
	case LimitMsgs:
		return "maximum messages exceeded"
	case LimitBytes:
		return "maximum bytes exceeded"
	default:
		return "maximum messages per subject exceeded"
	}
}

// liveRow is a live message as limits see it.
type liveRow struct {
	seq, size uint64
}

// headPrefetchMax caps the oldest rows read ahead in the first round trip; an eviction that
// needs more reads them in an extra one.
const headPrefetchMax = 1 << 14

// holdings is what one stream holds while an append transaction decides its batch: the
// counts of the locked state row, kept current message by message, the oldest live rows
// (fetched as far as needed), the live rows of the batch's subjects when a per-subject limit
// applies, and what the transaction stores and removes. Removing never touches a row: rows
// passed at the front are left behind the first sequence, others get a tombstone.
type holdings struct {
	db       *DB
	streamID int64
	st       *lockedState
	lim      Limits

	head    []liveRow // the oldest live rows stored before this transaction
	headPos int       // head[:headPos] are behind the first sequence now
	dbLive  uint64    // live rows stored before this transaction

	stored    []liveRow // rows this transaction stores, in order
	storedPos int

	subjects map[string][]liveRow // live rows per subject, oldest first
	dead     map[uint64]bool      // tombstoned by this transaction
	tombs    []liveRow            // tombstones and, with size 0, gap markers to insert
	removed  bool                 // something stored before this batch's messages went away
	moved    bool                 // the first sequence may no longer be live
}

// newHoldings starts a stream's holdings; live holds the live rows of the batch's subjects
// when they were read (a per-subject limit or a subject rollup), which it then tracks.
func newHoldings(db *DB, streamID int64, st *lockedState, lim Limits, live []subjectRow, subjects bool) *holdings {
	h := &holdings{db: db, streamID: streamID, st: st, lim: lim, dbLive: st.msgs}
	if subjects {
		h.subjects = make(map[string][]liveRow)
		for _, lr := range live {
			h.subjects[lr.subject] = append(h.subjects[lr.subject], lr.row)
		}
	}
	return h
}

// prefetch is how many of the oldest rows the first round trip should read for a batch of n
// messages of nbytes: the evictions the previous commit's counts predict, and for per-subject
// limits the few rows that replacing the first message needs. Too few only costs an extra
// round trip; too many costs reading rows that stay.
func prefetch(lim Limits, last tailState, known bool, n int, nbytes uint64) int {
	want := 0
	if lim.MaxMsgsPer > 0 {
		want = 2
	}
	if !lim.evictsOld() || !known {
		return want
	}
	if lim.MaxMsgs > 0 {
		want = max(want, int(int64(last.msgs)+int64(n)-lim.MaxMsgs)+1)
	}
	if lim.MaxBytes > 0 && n > 0 {
		over := int64(last.bytes) + int64(nbytes) - lim.MaxBytes
		if over > 0 {
			avg := max(nbytes/uint64(n), 1)
			if last.msgs > 0 {
				avg = max(min(avg, last.bytes/last.msgs), 1)
			}
			want = max(want, int(over/int64(avg))*5/4+2)
		}
	}
	return min(want, headPrefetchMax)
}

// admit is JetStream's discard-new check for one message about to be stored.
func (h *holdings) admit(subject string, size uint64) *LimitError {
	lim := h.lim
	if !lim.DiscardNew {
		return nil
	}
	// A message over the per-subject limit replaces its subject's oldest one, so without
	// DiscardNewPer it does not grow the stream by a message, nor by more bytes than it adds
	// over the one it replaces.
	replaces := false
	var replacedSize uint64
	if lim.MaxMsgsPer > 0 {
		if live := h.subjects[subject]; int64(len(live))+1 > lim.MaxMsgsPer {
			if lim.DiscardNewPer {
				return &LimitError{Kind: LimitMsgsPerSubject}
			}
			replaces, replacedSize = true, live[0].size
		}
	}
	if lim.MaxMsgs > 0 && h.st.msgs >= uint64(lim.MaxMsgs) && !replaces {
		return &LimitError{Kind: LimitMsgs}
	}
	if lim.MaxBytes > 0 && h.st.bytes+size > uint64(lim.MaxBytes) && (!replaces || replacedSize < size) {
		return &LimitError{Kind: LimitBytes}
	}
	return nil
}

// skip records a sequence taken by a publish that is not stored (no interest). Taken at the
// front it moves the first sequence past it; anywhere else it leaves a gap marker.
func (h *holdings) skip(seq uint64) {
	if h.st.msgs == 0 {
		h.st.firstSeq = seq + 1
		return
	}
	h.tombs = append(h.tombs, liveRow{seq: seq})
}

// store counts a message this transaction stores and applies the per-subject limit.
func (h *holdings) store(seq uint64, subject string, size uint64) {
	r := liveRow{seq: seq, size: size}
	h.stored = append(h.stored, r)
	h.st.msgs++
	h.st.bytes += size
	if h.subjects == nil {
		return
	}
	live := append(h.subjects[subject], r)
	for h.lim.MaxMsgsPer > 0 && int64(len(live)) > h.lim.MaxMsgsPer {
		h.kill(live[0])
		live = live[1:]
	}
	h.subjects[subject] = live
}

// rollup applies a Nats-Rollup header of the message just stored at seq: its subject's
// older messages get tombstones; for the whole stream, the first sequence moves to seq,
// which leaves every older row behind it without touching one.
func (h *holdings) rollup(kind Rollup, seq uint64, subject string) {
	switch kind {
	case RollupSubject:
		live := h.subjects[subject]
		for _, r := range live[:len(live)-1] {
			h.kill(r)
		}
		h.subjects[subject] = live[len(live)-1:]
	case RollupAll:
		r := h.stored[len(h.stored)-1]
		h.st.firstSeq, h.st.msgs, h.st.bytes = seq, 1, r.size
		h.headPos, h.dbLive = len(h.head), uint64(len(h.head))
		h.storedPos = len(h.stored) - 1
		if h.subjects != nil {
			clear(h.subjects)
			h.subjects[subject] = []liveRow{r}
		}
		h.removed = true
	}
}

// kill tombstones a live row.
func (h *holdings) kill(r liveRow) {
	if h.dead == nil {
		h.dead = make(map[uint64]bool)
	}
	h.dead[r.seq] = true
	h.tombs = append(h.tombs, r)
	h.st.msgs--
	h.st.bytes -= r.size
	h.removed, h.moved = true, true
}

// evictOld removes the oldest messages until max_msgs and max_bytes hold, for discard old.
func (h *holdings) evictOld(ctx context.Context, q querier) error {
	if !h.lim.evictsOld() {
		return nil
	}
	over := func() bool {
		return (h.lim.MaxMsgs > 0 && h.st.msgs > uint64(h.lim.MaxMsgs)) ||
			(h.lim.MaxBytes > 0 && h.st.bytes > uint64(h.lim.MaxBytes))
	}
	for over() {
		r, ok, err := h.front(ctx, q)
		if err != nil || !ok {
			return err
		}
		h.pass()
		h.st.msgs--
		h.st.bytes -= r.size
		h.removed, h.moved = true, true
	}
	return nil
}

// front returns the oldest live row, reading more of the oldest rows when it runs out of
// them. ok is false when the stream holds nothing.
func (h *holdings) front(ctx context.Context, q querier) (r liveRow, ok bool, err error) {
	for {
		for h.headPos < len(h.head) {
			if r := h.head[h.headPos]; !h.dead[r.seq] {
				return r, true, nil
			}
			h.headPos++
		}
		if uint64(len(h.head)) >= h.dbLive {
			break
		}
		from := h.st.firstSeq
		if n := len(h.head); n > 0 {
			from = h.head[n-1].seq + 1
		}
		more, err := h.db.fetchHead(ctx, q, h.streamID, from, int(min(h.dbLive-uint64(len(h.head)), headPrefetchMax)))
		if err != nil {
			return liveRow{}, false, err
		}
		if len(more) == 0 {
			h.dbLive = uint64(len(h.head))
			break
		}
		h.head = append(h.head, more...)
	}
	for h.storedPos < len(h.stored) {
		if r := h.stored[h.storedPos]; !h.dead[r.seq] {
			return r, true, nil
		}
		h.storedPos++
	}
	return liveRow{}, false, nil
}

// pass moves past the row front returned.
func (h *holdings) pass() {
	if h.headPos < len(h.head) {
		h.headPos++
		return
	}
	h.storedPos++
}

// settleFirst sets the first sequence to the oldest live row once removals may have taken
// the one it named.
func (h *holdings) settleFirst(ctx context.Context, q querier) error {
	if !h.moved {
		return nil
	}
	r, ok, err := h.front(ctx, q)
	switch {
	case err != nil:
		return err
	case ok:
		h.st.firstSeq = r.seq
	default:
		h.st.firstSeq = h.st.lastSeq + 1
	}
	return nil
}

// live reports whether a row this transaction stored is still held once it commits.
func (h *holdings) live(seq uint64) bool {
	return seq >= h.st.firstSeq && !h.dead[seq]
}
