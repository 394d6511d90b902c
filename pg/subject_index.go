package pg

import (
	"context"
	"slices"
)

// A publish into a stream with a per-subject limit (every key-value bucket) must know the
// live messages of its subject: the general append reads them under the row lock, in a
// round trip of its own. A subject index is this process's copy of every live message of
// such a stream, by subject, valid for exactly one state of the stream's row (first and last
// sequence, message and byte counts). The fast path decides replacements from it and sends
// the state update guarded by that whole state: any change made elsewhere (another
// replica's append, a delete, a purge, an expiry) moves at least one of the four, the guard
// then matches no row, and the general path takes over and drops the index. The general path
// starts an index on a stream it finds empty under its row lock, or reads one, in the same
// transaction, for a stream of at most SubjectIndexLoadRows messages (after a restart, or
// once a delete dropped the index); indexes are kept only within SubjectIndexRows.

// SubjectIndexRows bounds the rows all subject indexes hold together. A stream whose index
// would go past it loses its index (counted in Stats.SubjectIndexDropped) and appends
// through the general path until it is found empty again.
const SubjectIndexRows = 1 << 18

// SubjectIndexLoadRows bounds the stream whose subject index the general path reads in
// whole: one read of that many rows at most, on an append that found no index.
const SubjectIndexLoadRows = 1 << 12

// indexedRow is a live row with its subject.
type indexedRow struct {
	subject string
	liveRow
}

// subjectIndex is every live row of one stream, for the state it names.
type subjectIndex struct {
	first, last, msgs, bytes uint64

	bySubject map[string][]liveRow // oldest first
	// order is the live rows in sequence order, and rows tombstoned since, which the front
	// skips and compaction removes.
	order []indexedRow
}

func newSubjectIndex(first, last uint64) *subjectIndex {
	return &subjectIndex{first: first, last: last, bySubject: make(map[string][]liveRow)}
}

// matches reports whether the index describes this state of the stream.
func (x *subjectIndex) matches(first, last, msgs, bytes uint64) bool {
	return x.first == first && x.last == last && x.msgs == msgs && x.bytes == bytes
}

// add records a stored row; it returns the rows the per-subject limit maxPer (0 for none)
// then replaces, which the caller tombstones.
func (x *subjectIndex) add(subject string, r liveRow, maxPer int64, killed []liveRow) []liveRow {
	live := append(x.bySubject[subject], r)
	for maxPer > 0 && int64(len(live)) > maxPer {
		killed = append(killed, live[0])
		x.msgs--
		x.bytes -= live[0].size
		live = live[1:]
	}
	x.bySubject[subject] = live
	x.order = append(x.order, indexedRow{subject, r})
	x.last = r.seq
	x.msgs++
	x.bytes += r.size
	return killed
}

// isLive reports whether a row of order is still live.
func (x *subjectIndex) isLive(r indexedRow) bool {
	for _, l := range x.bySubject[r.subject] {
		if l.seq == r.seq {
			return true
		}
	}
	return false
}

// settle moves the first sequence to the oldest live row, or past the last with none, and
// compacts order once rows tombstoned behind the front make up most of it.
func (x *subjectIndex) settle() {
	for len(x.order) > 0 && !x.isLive(x.order[0]) {
		x.order = x.order[1:]
	}
	if len(x.order) == 0 {
		x.order = nil
		x.first = x.last + 1
		return
	}
	x.first = x.order[0].seq
	if uint64(len(x.order)) > 2*x.msgs+64 {
		x.order = slices.DeleteFunc(slices.Clone(x.order), func(r indexedRow) bool { return !x.isLive(r) })
	}
}

// passFirst drops every row below first: the general path moved the first sequence past
// them.
func (x *subjectIndex) passFirst(first uint64) {
	for len(x.order) > 0 && x.order[0].seq < first {
		r := x.order[0]
		x.order = x.order[1:]
		if live := x.bySubject[r.subject]; len(live) > 0 && live[0].seq == r.seq {
			x.msgs--
			x.bytes -= r.size
			if len(live) == 1 {
				delete(x.bySubject, r.subject)
			} else {
				x.bySubject[r.subject] = live[1:]
			}
		}
	}
}

// subjectIndexes holds each stream's subject index, bounded by SubjectIndexRows.
type subjectIndexes struct{ streamCache[*subjectIndex] }

func (x *subjectIndex) cacheCost() int { return len(x.order) }

// afterGeneral brings a stream's index past a commit of the general path, given the state
// the transaction locked, the one it committed, its tombstones, the subjects of its batch
// and the rows it stored that are still held; or drops it. A transaction tombstones only the
// oldest rows of its batch's subjects (a per-subject limit, a subject rollup) and moves the
// first sequence past older rows; anything else it did shows as counts the index does not
// reach, and drops it. A stream found empty starts one.
func (s *subjectIndexes) afterGeneral(id int64, x *subjectIndex, before lockedState, after *lockedState, tombs []liveRow, subjects []string, stored []Message) {
	if x == nil || !x.matches(before.firstSeq, before.lastSeq, before.msgs, before.bytes) {
		return
	}
	if len(tombs) > 0 {
		dead := make(map[uint64]bool, len(tombs))
		for _, t := range tombs {
			dead[t.seq] = true
		}
		for _, subj := range subjects {
			live := x.bySubject[subj]
			for len(live) > 0 && dead[live[0].seq] {
				x.msgs--
				x.bytes -= live[0].size
				live = live[1:]
			}
			if len(live) == 0 {
				delete(x.bySubject, subj)
			} else {
				x.bySubject[subj] = live
			}
		}
	}
	x.passFirst(after.firstSeq)
	for _, m := range stored {
		x.add(m.Subject, liveRow{seq: m.Seq, size: MessageSize(after.memory, m.Subject, m.Header, m.Data)}, 0, nil)
	}
	x.last = after.lastSeq
	x.settle()
	if x.matches(after.firstSeq, after.lastSeq, after.msgs, after.bytes) {
		s.put(id, x)
	}
}

// subjectIndexFor returns the index of a stream whose state row the general path has
// locked, at that state: the one taken, if it still describes it; a new one if the stream
// is empty; one read from the stream's rows if it holds at most SubjectIndexLoadRows; or nil.
func (db *DB) subjectIndexFor(ctx context.Context, q querier, id int64, st *lockedState, x *subjectIndex) (*subjectIndex, error) {
	switch {
	case x != nil && x.matches(st.firstSeq, st.lastSeq, st.msgs, st.bytes):
		return x, nil
	case st.msgs == 0:
		return newSubjectIndex(st.firstSeq, st.lastSeq), nil
	case st.msgs > SubjectIndexLoadRows:
		return nil, nil
	}
	chunks, err := db.chunks.list(ctx, q, id, st.lastSeq)
	if err != nil {
		return nil, err
	}
	x = newSubjectIndex(st.firstSeq, st.lastSeq)
	for _, c := range liveChunks(chunks, st.firstSeq, st.lastSeq) {
		rows, err := q.Query(ctx, `SELECT m.subject, m.seq, `+sqlSize(st.memory)+` FROM `+chunkTable(id, c.chunk)+` m
			WHERE m.seq BETWEEN $2 AND $3 AND `+sqlLive+` ORDER BY m.seq`, id, int64(st.firstSeq), int64(st.lastSeq))
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var subj string
			var r liveRow
			if err := rows.Scan(&subj, &r.seq, &r.size); err != nil {
				rows.Close()
				return nil, err
			}
			x.add(subj, r, 0, nil)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	x.last = st.lastSeq
	x.settle()
	return x, nil
}
