package pg

import "context"

// A message may purge another subject as it is stored (AppendMsg.Purge): the message a
// one-shot schedule produces takes its schedule away, and a client removes a schedule so
// (bridge/schedule). The purge is decided under the stream's row lock and written in the
// message's own transaction, as tombstones like a subject roll-up's, so that no crash,
// broken session or takeover can leave the message stored without its purge, or the
// purge without the message.

// PurgeCheckFunc decides, from the last live message of the subject a message purges (nil
// when there is none), whether the message may be stored; its error refuses the message,
// as an Outcome's Err.
type PurgeCheckFunc func(last *Message) error

// checkPurge runs m.PurgeCheck on the last live message of m.Purge, among those stored
// before the transaction and those the batch stored before m (earlier). refused is
// PurgeCheck's error; err is the database's.
func (db *DB) checkPurge(ctx context.Context, q querier, streamID int64, st *lockedState, earlier []Message, h *holdings, m *AppendMsg) (refused, err error) {
	if m.Purge == "" || m.PurgeCheck == nil {
		return nil, nil
	}
	for i := len(earlier) - 1; i >= 0; i-- {
		if e := &earlier[i]; e.Subject == m.Purge && h.live(e.Seq) {
			return m.PurgeCheck(e), nil
		}
	}
	last, err := db.lastMatching(ctx, q, streamID, m.Purge, st.committedFirst, st.lastSeq)
	if err != nil {
		return nil, err
	}
	if last != nil && !h.live(last.Seq) {
		// The batch removed it, and the older ones of its subject with it.
		last = nil
	}
	return m.PurgeCheck(last), nil
}

// purge tombstones every live message of subject, none when subject is empty.
func (h *holdings) purge(subject string) {
	if subject == "" {
		return
	}
	for _, r := range h.subjects[subject] {
		h.kill(r)
	}
	delete(h.subjects, subject)
}
