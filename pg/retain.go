package pg

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// SeqRange is an inclusive range of stream sequences.
type SeqRange struct {
	From, To uint64
}

// RetainConsumer is what interest and workqueue retention need of one consumer.
type RetainConsumer struct {
	Floor   uint64   // the ack floor: everything at or below it is acknowledged
	Filters []string // empty: every subject
	Acked   []uint64 // acknowledged above the floor
}

func (c *RetainConsumer) matches(subject string) bool {
	if len(c.Filters) == 0 {
		return true
	}
	for _, f := range c.Filters {
		if SubjectMatches(f, subject) {
			return true
		}
	}
	return false
}

func (c *RetainConsumer) done(seq uint64) bool {
	_, acked := slices.BinarySearch(c.Acked, seq)
	return seq <= c.Floor || acked
}

// RetainParams asks Retain to remove what no consumer needs any more.
type RetainParams struct {
	StreamID int64
	// WorkQueue keeps messages that no consumer's filter matches (workqueue retention);
	// otherwise nothing keeps them (interest retention).
	WorkQueue bool
	Consumers []RetainConsumer
	// Recheck are ranges where a message may have lost the last consumer that needed it
	// through a floor moving, a consumer going away or filters changing. Messages below the
	// first one still needed are found without them.
	Recheck []SeqRange
}

// RetainResult is what Retain did.
type RetainResult struct {
	FirstSeq   uint64
	Removed    uint64   // live messages removed
	Tombstoned uint64   // of which left as tombstones above the first sequence
	Gone       []uint64 // the Acked sequences that are no longer live, removed now or before
}

// Retain applies interest or workqueue retention: a message is removed once every consumer
// whose filter matches it has acknowledged it (and, for a work queue, some consumer's filter
// matches it). The first sequence moves past every such message at the front; messages
// further on are tombstoned. Like every removal it is one transaction under the state row's
// lock, and it never updates or deletes a message row.
func (db *DB) Retain(ctx context.Context, p RetainParams) (RetainResult, error) {
	var res RetainResult
	err := db.backgroundTx(ctx, func(ctx context.Context, q querier) error {
		res = RetainResult{}
		st, err := lockState(ctx, q, p.StreamID)
		if err != nil {
			return err
		}
		r := retainer{db: db, q: q, st: st, p: &p}
		before := st.msgs
		front, err := r.firstNeeded(ctx, st.first)
		if err != nil {
			return err
		}
		if err := r.tombstoneAcked(ctx, front); err != nil {
			return err
		}
		for _, rg := range p.Recheck {
			n, err := r.tombstoneUnneeded(ctx, max(rg.From, front+1), rg.To)
			if err != nil {
				return err
			}
			res.Tombstoned += n
		}
		res.Tombstoned += r.tombstoned
		if front, err = r.firstNeeded(ctx, front); err != nil {
			return err
		}
		if _, err := db.advanceFirst(ctx, q, st, front); err != nil {
			return err
		}
		res.FirstSeq = st.first
		res.Removed = before - st.msgs
		res.Gone = r.gone
		for _, c := range p.Consumers {
			for _, seq := range c.Acked {
				if seq < st.first {
					res.Gone = append(res.Gone, seq)
				}
			}
		}
		return db.saveIf(ctx, q, st, res.Removed)
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return RetainResult{}, fmt.Errorf("pg: retention: %w", err)
	}
	return res, err
}

// retainer is one Retain transaction.
type retainer struct {
	db         *DB
	q          querier
	st         *stateRow
	p          *RetainParams
	tombstoned uint64
	gone       []uint64
}

// filtered reports whether some consumer is filtered, so that whether a message is needed
// depends on its subject.
func (r *retainer) filtered() bool {
	for _, c := range r.p.Consumers {
		if len(c.Filters) > 0 && !slices.Contains(c.Filters, ">") {
			return true
		}
	}
	return false
}

// floorNeeded is SQL that is true for a chunk row m that some consumer's floor still holds:
// a consumer whose filter matches it has not acknowledged through it, or, in a work queue, no
// consumer's filter matches it. Its placeholders start at $(base+1); it returns their values.
func (r *retainer) floorNeeded(base int) (string, []any) {
	var floors []int64
	var res []string
	for _, c := range r.p.Consumers {
		filters := c.Filters
		if len(filters) == 0 {
			filters = []string{">"}
		}
		for _, f := range filters {
			floors = append(floors, int64(c.Floor))
			res = append(res, SubjectRegexp(f))
		}
	}
	return fmt.Sprintf(`(EXISTS (SELECT 1 FROM unnest($%d::bigint[], $%d::text[]) c(floor, re)
			WHERE m.seq > c.floor AND m.subject ~ c.re)
		OR ($%d AND NOT m.subject ~ ANY($%d::text[])))`, base+1, base+2, base+3, base+2),
		[]any{floors, res, r.p.WorkQueue}
}

// firstNeeded is the first live sequence at or after from that some consumer's floor still
// holds, or last + 1.
func (r *retainer) firstNeeded(ctx context.Context, from uint64) (uint64, error) {
	st := r.st
	from = max(from, st.first)
	if len(r.p.Consumers) == 0 {
		if r.p.WorkQueue {
			return from, nil
		}
		return st.last + 1, nil
	}
	if !r.filtered() {
		low := r.p.Consumers[0].Floor
		for _, c := range r.p.Consumers[1:] {
			low = min(low, c.Floor)
		}
		from = max(from, low+1)
		if from > st.last {
			return st.last + 1, nil
		}
		m, err := r.db.messageAt(ctx, r.q, st.id, from, st.last)
		if err != nil || m == nil {
			return st.last + 1, err
		}
		return m.Seq, nil
	}
	if from > st.last {
		return st.last + 1, nil
	}
	chunks, err := r.db.chunks.list(ctx, r.q, st.id, st.last)
	if err != nil {
		return 0, err
	}
	cond, args := r.floorNeeded(3)
	for _, c := range liveChunks(chunks, from, st.last) {
		var seq *int64
		err := r.q.QueryRow(ctx, `SELECT min(m.seq) FROM `+chunkTable(st.id, c.chunk)+` m
			WHERE m.seq BETWEEN $2 AND $3 AND `+sqlLive+` AND `+cond,
			append([]any{st.id, int64(from), int64(st.last)}, args...)...).Scan(&seq)
		if err != nil {
			return 0, fmt.Errorf("find first needed message of stream %d: %w", st.id, err)
		}
		if seq != nil {
			return uint64(*seq), nil
		}
	}
	return st.last + 1, nil
}

// tombstoneUnneeded tombstones the live messages in [from, to] that no consumer's floor holds.
func (r *retainer) tombstoneUnneeded(ctx context.Context, from, to uint64) (uint64, error) {
	if !r.filtered() {
		// Unfiltered, the lowest floor holds every message above it, and the first
		// sequence moves up to it.
		return 0, nil
	}
	cond, args := r.floorNeeded(3)
	return r.db.tombstoneWhere(ctx, r.q, r.st, from, to, `NOT `+cond, args...)
}

// tombstoneAcked removes the individually acknowledged messages at or after front that every
// consumer they concern has acknowledged.
func (r *retainer) tombstoneAcked(ctx context.Context, front uint64) error {
	var cand []uint64
	for _, c := range r.p.Consumers {
		for _, seq := range c.Acked {
			if seq >= front && seq <= r.st.last {
				cand = append(cand, seq)
			}
		}
	}
	if len(cand) == 0 {
		return nil
	}
	slices.Sort(cand)
	cand = slices.Compact(cand)
	subjects, err := r.subjectsOf(ctx, cand)
	if err != nil {
		return err
	}
	var kill []int64
	for _, seq := range cand {
		subj, live := subjects[seq]
		if !live {
			r.gone = append(r.gone, seq)
			continue
		}
		if r.removable(seq, subj) {
			kill = append(kill, int64(seq))
			r.gone = append(r.gone, seq)
		}
	}
	if len(kill) == 0 {
		return nil
	}
	n, err := r.db.tombstoneWhere(ctx, r.q, r.st, uint64(kill[0]), uint64(kill[len(kill)-1]), `m.seq = ANY($4)`, kill)
	r.tombstoned += n
	return err
}

// removable decides one message from the consumers' floors and acknowledgements.
func (r *retainer) removable(seq uint64, subject string) bool {
	matched := false
	for i := range r.p.Consumers {
		c := &r.p.Consumers[i]
		if !c.matches(subject) {
			continue
		}
		matched = true
		if !c.done(seq) {
			return false
		}
	}
	return matched || !r.p.WorkQueue
}

// subjectsOf returns the subjects of the live messages among seqs (sorted).
func (r *retainer) subjectsOf(ctx context.Context, seqs []uint64) (map[uint64]string, error) {
	st := r.st
	chunks, err := r.db.chunks.list(ctx, r.q, st.id, seqs[len(seqs)-1])
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]string, len(seqs))
	want := make([]int64, len(seqs))
	for i, s := range seqs {
		want[i] = int64(s)
	}
	for _, c := range liveChunks(chunks, seqs[0], seqs[len(seqs)-1]) {
		rows, err := r.q.Query(ctx, `SELECT m.seq, m.subject FROM `+chunkTable(st.id, c.chunk)+` m
			WHERE m.seq = ANY($2) AND `+sqlLive, st.id, want)
		if err != nil {
			return nil, fmt.Errorf("read subjects of acknowledged messages of stream %d: %w", st.id, err)
		}
		for rows.Next() {
			var seq uint64
			var subj string
			if err := rows.Scan(&seq, &subj); err != nil {
				rows.Close()
				return nil, err
			}
			out[seq] = subj
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
