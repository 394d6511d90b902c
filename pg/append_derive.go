package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// A derived message (AppendMsg.Derive) is made, in the append transaction, from the last
// live message of its subject: a counter's increment adds to the total its subject's last
// message holds. The general path reads those last messages in its first round trip, after
// the statement that locks the stream's row, so that no other transaction can store one in
// between; the messages the batch stores before it count too. The fast path takes such a
// batch only with the last messages this process remembers (below).

// DeriveFunc makes a message's header and data from the last live message of its subject,
// nil when there is none. An error refuses the message with it, as an Outcome's Err.
type DeriveFunc func(last *Message) (hdr, data []byte, err error)

// deriveSubjects lists the distinct subjects of a batch's derived messages.
func deriveSubjects(b AppendBatch) []string {
	var out []string
	seen := make(map[string]bool)
	for i := range b.Msgs {
		m := &b.Msgs[i]
		if m.Derive != nil && !seen[m.Subject] {
			seen[m.Subject] = true
			out = append(out, m.Subject)
		}
	}
	return out
}

// queueLasts queues the read of the last live message of each of subjects.
func queueLasts(b *pgx.Batch, streamID int64, subjects []string) {
	b.Queue(`SELECT subject, seq, hdr, data FROM jetgres.subject_last($1, $2)`, streamID, subjects)
}

// readLasts reads what queueLasts queued, by subject.
func readLasts(br pgx.BatchResults) (map[string]*Message, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Message, error) {
		var m Message
		var seq int64
		err := r.Scan(&m.Subject, &seq, &m.Header, &m.Data)
		m.Seq = uint64(seq)
		return m, err
	})
	if err != nil {
		return nil, err
	}
	last := make(map[string]*Message, len(msgs))
	for i := range msgs {
		last[msgs[i].Subject] = &msgs[i]
	}
	return last, nil
}

// derive makes m's stored header and data: as published, or from Derive given the last
// live message of m's subject, among those read before the batch and those the batch
// stored. refused is Derive's error; err is the database's.
func derive(ctx context.Context, q querier, m *AppendMsg, last map[string]*Message, h *holdings) (hdr, data []byte, refused, err error) {
	if m.Derive == nil {
		return m.Header, m.Data, nil, nil
	}
	prev := last[m.Subject]
	if prev != nil {
		// nats-server applies discard-old limits as it stores each message, so the batch's
		// earlier messages may have evicted the last one of this subject, and every older
		// one with it. The evictions run now, not once at the end, to see that.
		if err := h.evictOld(ctx, q); err != nil {
			return nil, nil, nil, err
		}
		if err := h.settleFirst(ctx, q); err != nil {
			return nil, nil, nil, err
		}
		if !h.live(prev.Seq) {
			prev = nil
		}
	}
	hdr, data, refused = m.Derive(prev)
	return hdr, data, refused, nil
}

// A stream's derived messages would need the general path's two round trips each time, the
// first one only to read the last messages of their subjects. This process remembers those
// last messages as its own commits leave them, valid for exactly one state of the stream's
// row (first and last sequence, message and byte counts), and the fast path derives from
// them and sends its state update guarded by that whole state, as it does for a subject
// index (subject_index.go): an append of another replica, a delete, a purge or an expiry
// moves one of the four, the guard matches no row, and the general path reads afresh.

// DerivedSubjectsMax bounds the subjects whose last message this process remembers for the
// fast path, over all streams. A stream that would go past it is forgotten (counted in
// Stats.DerivedLastsDropped), and its derived messages take the general path until
// something is forgotten elsewhere.
const DerivedSubjectsMax = 1 << 16

// derivedLasts is the last message of the subjects that derived messages read or wrote,
// per stream, bounded by DerivedSubjectsMax.
type derivedLasts struct{ streamCache[*streamLasts] }

// streamLasts is one stream's: the last live message of each subject, nil for a subject
// known to have none, for the state it names.
type streamLasts struct {
	first, last, msgs, bytes uint64
	bySubject                map[string]*Message
}

func (s *streamLasts) matches(st tailState) bool {
	return s.first == st.firstSeq && s.last == st.lastSeq && s.msgs == st.msgs && s.bytes == st.bytes
}

// knows reports whether s holds the last message of every subject bt derives from.
func (s *streamLasts) knows(bt AppendBatch) bool {
	for i := range bt.Msgs {
		if m := &bt.Msgs[i]; m.Derive != nil {
			if _, ok := s.bySubject[m.Subject]; !ok {
				return false
			}
		}
	}
	return true
}

func (s *streamLasts) cacheCost() int { return len(s.bySubject) }

// afterGeneral remembers the lasts a general path's commit leaves for a batch that read
// them: what it read and stored for its subjects, and what was remembered of the others
// when that still held for the state the transaction locked and the batch removed nothing.
// A removal may have taken any subject's last message, which only reading can tell.
func (d *derivedLasts) afterGeneral(id int64, old *streamLasts, before lockedState, h *holdings, subjects []string, last map[string]*Message) {
	s := &streamLasts{first: h.st.firstSeq, last: h.st.lastSeq, msgs: h.st.msgs, bytes: h.st.bytes}
	if old != nil && !h.removed && old.first == before.firstSeq && old.last == before.lastSeq && old.msgs == before.msgs && old.bytes == before.bytes {
		s.bySubject = old.bySubject
	} else {
		s.bySubject = make(map[string]*Message, len(subjects))
	}
	for _, subj := range subjects {
		m := last[subj]
		if m != nil && !h.live(m.Seq) {
			m = nil
		}
		s.bySubject[subj] = m
	}
	d.put(id, s)
}

// planDerived derives the messages of a batch from what s remembers, as the fast path stores
// them from the state st: it returns false when a message is refused or a limit would
// refuse or evict, both of which the general path decides.
func planDerived(bt AppendBatch, st tailState, s *streamLasts, p *fastPlan) bool {
	next := make(map[string]*Message)
	for j := range bt.Msgs {
		m := &bt.Msgs[j]
		hdr, data := m.Header, m.Data
		if m.Derive != nil {
			prev, ok := next[m.Subject]
			if !ok {
				prev = s.bySubject[m.Subject]
			}
			var refused error
			if hdr, data, refused = m.Derive(prev); refused != nil {
				return false
			}
			p.res.Outcomes[j].Data = string(data)
		}
		p.next.lastSeq++
		msg := Message{Seq: p.next.lastSeq, TS: p.next.lastTS, Subject: m.Subject, Header: hdr, Data: data, cumBefore: p.next.cumBytes}
		p.next.cumBytes += MessageSize(st.memory, m.Subject, hdr, data)
		p.res.Stored = append(p.res.Stored, msg)
		p.res.Outcomes[j].Seq = msg.Seq
		if m.Derive != nil {
			next[m.Subject] = &p.res.Stored[len(p.res.Stored)-1]
		}
	}
	n, nbytes := uint64(len(bt.Msgs)), p.next.cumBytes-st.cumBytes
	if l := bt.Limits; (l.MaxMsgs > 0 && st.msgs+n > uint64(l.MaxMsgs)) || (l.MaxBytes > 0 && st.bytes+nbytes > uint64(l.MaxBytes)) {
		return false
	}
	p.next.chunkRows += int64(n)
	p.next.msgs += n
	p.next.bytes += nbytes
	p.res.LastSeq = p.next.lastSeq
	// The lasts move with the state. s was taken from the stream's: should the guard fail,
	// nobody puts it back.
	s.first, s.last, s.msgs, s.bytes = p.next.firstSeq, p.next.lastSeq, p.next.msgs, p.next.bytes
	for k, v := range next {
		c := *v
		s.bySubject[k] = &c
	}
	p.lasts = s
	return true
}

// fastDerived plans a batch of derived messages for the fast path, from the stream's state
// st (known says whether this process has one) and the last messages it remembers; false
// leaves the batch to the general path.
func (db *DB) fastDerived(bt AppendBatch, st tailState, known bool, ts int64) (fastPlan, bool) {
	if !known {
		return fastPlan{}, false
	}
	s := db.lasts.take(bt.StreamID)
	if s == nil {
		return fastPlan{}, false
	}
	p := fastPlan{bt: bt, prev: st, next: st}
	p.next.lastTS = max(st.lastTS, ts)
	p.res = AppendResult{StreamID: bt.StreamID, Outcomes: make([]Outcome, len(bt.Msgs)), Stored: make([]Message, 0, len(bt.Msgs))}
	if bt.Limits.MaxMsgsPer > 0 || !fastShape(bt, st, true) || !s.matches(st) || !s.knows(bt) || !planDerived(bt, st, s, &p) {
		db.lasts.put(bt.StreamID, s)
		return fastPlan{}, false
	}
	return p, true
}
