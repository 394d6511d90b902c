// Package purgemove decides how a purge request moves a stream's consumers, as nats-server
// moves them: all of them for a purge of every subject; for a purge of a subject, one whose
// filters equal it or lie inside it, up to the first message left on that subject, and one
// whose filters reach beyond it but cover it (wider), up to the stream's first sequence,
// dropping its pending deliveries of purged messages. Consumers whose filters only partly
// overlap the subject stay where they are, as there. It reads PostgreSQL once per purge and
// keeps nothing; it has no locks.
package purgemove

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

// PurgeStore is what NewPlan reads; *pg.DB satisfies it.
type PurgeStore interface {
	State(ctx context.Context, id int64) (pg.StreamState, error)
	NextBySubject(ctx context.Context, streamID int64, filter string, from uint64) (*pg.Message, error)
}

// Plan is how one purge request moves a stream's consumers.
type Plan struct {
	subject           string
	first, left, last uint64
}

// Move is how a purge moves one consumer: the arguments of consumerstate's Purged.
type Move struct {
	Start, Last uint64
	// Wider says the consumer's filters reach beyond the purged subject: its pending
	// deliveries that the purge removed, Gone, are dropped. The caller fills Gone in.
	Wider bool
	Gone  map[uint64]bool
}

// IsGone reports whether the purge removed a pending delivery of seq.
func (m *Move) IsGone(seq uint64) bool { return m.Gone[seq] }

// NewPlan reads what a purge of subject (empty: every subject) of the stream streamID
// left, once the purge is done.
func NewPlan(ctx context.Context, db PurgeStore, streamID int64, subject string) (Plan, error) {
	st, err := db.State(ctx, streamID)
	if err != nil {
		return Plan{}, fmt.Errorf("stream state after a purge: %w", err)
	}
	first := st.FirstSeq
	if st.Msgs == 0 {
		first = st.LastSeq + 1
	}
	left := first
	if subject != "" {
		// 0 when nothing is left on the subject: Purged then moves past the last sequence.
		left = 0
		m, err := db.NextBySubject(ctx, streamID, subject, first)
		switch {
		case err == nil:
			left = m.Seq
		case !errors.Is(err, pg.ErrNotFound):
			return Plan{}, fmt.Errorf("first message left after a purge: %w", err)
		}
		if st.Msgs == 0 {
			left = first
		}
	}
	return Plan{subject: subject, first: first, left: left, last: st.LastSeq}, nil
}

// For is how the plan moves a consumer with filters; ok is false when it stays where it is.
func (p Plan) For(filters []string) (move *Move, ok bool) {
	move = &Move{Start: p.left, Last: p.last}
	if p.subject == "" {
		return move, true
	}
	inside := equalOrInside(filters, p.subject)
	if !inside && !covers(filters, p.subject) {
		return nil, false
	}
	if !inside || !allInside(filters, p.subject) {
		move.Start, move.Wider = p.first, true
	}
	return move, true
}

// equalOrInside reports whether one of a consumer's filters equals subject or lies inside
// it; no filters lie inside no subject.
func equalOrInside(filters []string, subject string) bool {
	return slices.ContainsFunc(filters, func(f string) bool { return f == subject || server.SubjectMatchesFilter(f, subject) })
}

// covers reports whether subject lies inside one of a consumer's filters; a consumer
// without filters covers every subject.
func covers(filters []string, subject string) bool {
	return len(filters) == 0 || slices.ContainsFunc(filters, func(f string) bool { return f == subject || server.SubjectMatchesFilter(subject, f) })
}

// allInside reports whether every one of a consumer's filters lies inside subject.
func allInside(filters []string, subject string) bool {
	return len(filters) > 0 && !slices.ContainsFunc(filters, func(f string) bool { return !server.SubjectMatchesFilter(f, subject) })
}
