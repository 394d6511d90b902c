package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// A derived message (AppendMsg.Derive) is made, in the append transaction, from the last
// live message of its subject: a counter's increment adds to the total its subject's last
// message holds. The general path reads those last messages in its first round trip, after
// the statement that locks the stream's row, so that no other transaction can store one in
// between; the messages the batch stores before it count too. The fast path, which decides
// nothing under the lock, never takes such a batch.

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
