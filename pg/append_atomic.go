package pg

import "errors"

// An atomic batch (AppendBatch.Atomic) is stored whole or not at all: the first message
// refused refuses every message of the batch, and the transaction stores nothing of it,
// though it still commits the other streams' batches. It holds nats-server's rules for
// the messages of an atomic batch publish, which its staging cannot decide without the
// stream's row lock.
var (
	// ErrBatchDuplicate refuses an atomic batch with a message whose Nats-Msg-Id the stream,
	// or the batch, has seen within the duplicate window.
	ErrBatchDuplicate = errors.New("pg: atomic batch contains a duplicate message")
	// ErrExpectInBatch refuses an atomic batch whose expectation cannot hold as the batch
	// stores: a Nats-Expected-Last-Sequence on a message after the first, or a
	// Nats-Expected-Last-Subject-Sequence on a subject an earlier message of the batch
	// writes.
	ErrExpectInBatch = errors.New("pg: expectation inside an atomic batch")
)

// atomicExpect is what an atomic batch asks of its message j beyond the expectations of
// any publish; lastSeq is the stream's last sequence with the batch's earlier messages
// stored. A Nats-Expected-Last-Sequence after the first message that does not hold is
// left to checkExpect, which answers it with the stream's last sequence, as nats-server
// does.
func atomicExpect(msgs []AppendMsg, j int, lastSeq uint64) error {
	m := &msgs[j]
	if j > 0 && m.ExpectLastSeq != nil && *m.ExpectLastSeq == lastSeq {
		return ErrExpectInBatch
	}
	if m.ExpectLastSubjSeq == nil {
		return nil
	}
	filter := m.ExpectLastSubjFilter
	if filter == "" {
		filter = m.Subject
	}
	for _, p := range msgs[:j] {
		if p.Subject == filter {
			return ErrExpectInBatch
		}
	}
	return nil
}

// atomicRefusal is the error that refuses an atomic batch given its outcomes so far, or
// nil when every message was stored.
func atomicRefusal(outcomes []Outcome) error {
	for _, o := range outcomes {
		switch {
		case o.Err != nil:
			return o.Err
		case o.Duplicate:
			return ErrBatchDuplicate
		}
	}
	return nil
}

// refuseAtomic undoes what deciding an atomic batch did to its stream's state and
// holdings, and gives every message the refusal: nothing of it is written.
func refuseAtomic(r *AppendResult, st *lockedState, before lockedState, h *holdings, err error) {
	*st = before
	h.tombs, h.removed = nil, false
	r.Stored = r.Stored[:0]
	for j := range r.Outcomes {
		r.Outcomes[j] = Outcome{Err: err}
	}
	r.LastSeq = st.lastSeq
}
