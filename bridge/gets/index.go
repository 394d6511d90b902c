package gets

import (
	"context"
	"errors"
	"sync"

	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/pg"
)

// Index is one stream's part of the gets: its last sequence per subject, what limits what
// memory may answer, and its tail.
type Index struct {
	ix   *Indexes
	id   int64
	tail *tailcache.Tail

	mu sync.Mutex // a leaf
	// last is nil once the stream is dropped.
	last map[string]uint64
	// bytes is what last holds, charged against Indexes.max.
	bytes int64
	// gen moves on every reset, so that a fill read from PostgreSQL before a reset cannot
	// put back what the reset forgot.
	gen uint64
	// first is the stream's first sequence as this process last saw it move: an entry or a
	// cached message below it is gone.
	first uint64
	// seen is the last sequence whose commit the entries reflect. A higher high-water mark in
	// the tail is another replica's commit, of subjects unknown here: the entries go.
	seen uint64
	// tailFrom is the lowest sequence whose tail answer is trusted: retention can remove
	// messages the tail still holds, and then the tail answers nothing at or below them.
	tailFrom uint64
}

// Request is a single get: the message at Seq, the last of LastFor, or the first at or
// after Seq that matches NextFor.
type Request struct {
	Seq     uint64
	LastFor string
	NextFor string
}

// Committed takes what one append committed: the stream's first and last sequences after
// it and the messages it stored, each now the last of its subject. The revisions that
// per-subject limits tombstoned belong to subjects of the same batch, whose entries move
// past them here.
func (x *Index) Committed(first, last uint64, stored []pg.Message) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.last == nil {
		return
	}
	x.first = max(x.first, first)
	x.seen = max(x.seen, last)
	for i := range stored {
		x.setLocked(stored[i].Subject, stored[i].Seq)
	}
}

// Purged forgets every entry after messages went other than below a commit's new first
// sequence (a purge, a delete, max_age, lowered limits, interest or workqueue retention):
// entries come back one miss at a time. The tail answers nothing it holds now: the
// stream clears it next, or keeps it for consumers that never go back to what went.
// first, when positive, is the stream's first sequence now.
func (x *Index) Purged(first uint64) {
	tailFrom := x.tail.HighWater() + 1
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.last == nil {
		return
	}
	x.resetLocked()
	x.tailFrom = max(x.tailFrom, tailFrom)
	x.first = max(x.first, first)
}

// Removed records a new first sequence that the stream reached without removing anything
// above it.
func (x *Index) Removed(first uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.first = max(x.first, first)
}

// Rewound forgets every entry, and what it saw of the stream, for the stream's first and
// last sequences now: the database went back to an earlier state (a standby promoted
// without the last commits), and the sequences after last will go to other messages. The
// stream's tail is rewound to last too, and what it takes from then on is trusted.
func (x *Index) Rewound(first, last uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.last == nil {
		return
	}
	x.resetLocked()
	x.first, x.seen, x.tailFrom = first, last, last+1
}

// Dropped forgets a deleted stream and gives its bytes back to the bound.
func (x *Index) Dropped() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ix.used.Add(-x.bytes)
	x.last, x.bytes = nil, 0
}

// setLocked records seq as the last of subject unless a later one is known, evicting other
// subjects of the stream when the bound is reached.
func (x *Index) setLocked(subject string, seq uint64) {
	if old, ok := x.last[subject]; ok {
		x.last[subject] = max(old, seq)
		return
	}
	ix := x.ix
	cost := int64(len(subject) + entryBytes)
	var evicted int
	// Map order is random enough to evict by: any entry may go, a miss reads it back.
	for k := range x.last {
		if ix.used.Load()+cost <= ix.max {
			break
		}
		x.dropLocked(k)
		evicted++
	}
	if ix.used.Load()+cost > ix.max {
		evicted++ // the other streams' entries hold the bound: this one is not kept
	} else {
		x.last[subject] = seq
		x.bytes += cost
		ix.used.Add(cost)
	}
	if evicted > 0 {
		ix.m.evictions.Add(float64(evicted))
	}
}

func (x *Index) dropLocked(subject string) {
	cost := int64(len(subject) + entryBytes)
	delete(x.last, subject)
	x.bytes -= cost
	x.ix.used.Add(-cost)
}

func (x *Index) resetLocked() {
	x.gen++
	x.ix.used.Add(-x.bytes)
	x.last, x.bytes = make(map[string]uint64), 0
}

// lastOf returns the indexed last sequence of subject and the generation it belongs to. hw
// is the stream's high-water mark as this process knows it.
func (x *Index) lastOf(subject string, hw uint64) (seq, gen uint64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if hw > x.seen {
		if x.last != nil {
			x.resetLocked()
		}
		x.seen = hw
	}
	seq, ok = x.last[subject]
	return seq, x.gen, ok && seq >= x.first
}

// fill records what PostgreSQL answered for subject, unless a reset came since gen.
func (x *Index) fill(gen uint64, subject string, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.gen == gen && x.last != nil {
		x.setLocked(subject, seq)
	}
}

// forget drops subject's entry if it still says seq, which was found gone.
func (x *Index) forget(gen uint64, subject string, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.gen == gen && x.last != nil && x.last[subject] == seq {
		x.dropLocked(subject)
	}
}

// trusted reports whether the tail's answer for seq may be given.
func (x *Index) trusted(seq uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return seq >= x.first && seq >= x.tailFrom
}

// Get finds the message a request names; pg.ErrNotFound when there is none.
func (x *Index) Get(ctx context.Context, req Request) (*pg.Message, error) {
	if m, live, ok := x.FromMemory(req); ok {
		if !live {
			return nil, pg.ErrNotFound
		}
		return m, nil
	}
	switch {
	case req.LastFor != "":
		return x.lastBySubject(ctx, req.LastFor)
	case req.NextFor != "":
		from := max(req.Seq, 1)
		return x.ix.shared(ctx, flightKey{stream: x.id, kind: nextBySubj, seq: from, subj: req.NextFor}, func() (*pg.Message, error) {
			return x.ix.db.NextBySubject(ctx, x.id, req.NextFor, from)
		})
	default:
		return x.BySeq(ctx, req.Seq)
	}
}

// FromMemory answers a get from memory alone: ok is false when memory cannot tell, live is
// false when the message is gone. Of the index's lookups it counts only the hit it answers
// with, so that a get it hands on is counted once, where it is answered.
func (x *Index) FromMemory(req Request) (m *pg.Message, live, ok bool) {
	if m, live, ok = x.memory(req); ok {
		x.ix.m.served.WithLabelValues("memory").Inc()
	}
	return m, live, ok
}

func (x *Index) memory(req Request) (m *pg.Message, live, ok bool) {
	switch {
	case req.LastFor != "":
		if !subjectIsLiteral(req.LastFor) {
			return nil, false, false
		}
		seq, _, found := x.lastOf(req.LastFor, x.tail.HighWater())
		if !found {
			return nil, false, false
		}
		if m, live, ok = x.tailGet(seq); !ok || !live {
			return nil, false, false
		}
		x.ix.m.lookups.WithLabelValues("hit").Inc()
		return m, true, true
	case req.NextFor != "":
		from := max(req.Seq, 1)
		if !x.trusted(from) {
			return nil, false, false
		}
		cached, _, found, covered := x.tail.Next(from, func(subject string) bool {
			return req.NextFor == subject || pg.SubjectMatches(req.NextFor, subject)
		})
		if !covered || !found {
			return nil, false, false
		}
		return &cached, true, true
	default:
		return x.tailGet(req.Seq)
	}
}

// BySeq returns the message at seq, from the tail if it is there.
func (x *Index) BySeq(ctx context.Context, seq uint64) (*pg.Message, error) {
	if m, live, ok := x.tailGet(seq); ok {
		x.ix.m.served.WithLabelValues("memory").Inc()
		if !live {
			return nil, pg.ErrNotFound
		}
		return m, nil
	}
	return x.ix.shared(ctx, flightKey{stream: x.id, kind: bySeq, seq: seq}, func() (*pg.Message, error) {
		return x.ix.db.GetMessage(ctx, x.id, seq)
	})
}

// lastBySubject answers a last-by-subject get that memory could not: a literal subject the
// index holds is one read by sequence, and a wildcard, or a subject the index does not
// hold, is one read of the newest match, which fills the index.
func (x *Index) lastBySubject(ctx context.Context, subject string) (*pg.Message, error) {
	ix := x.ix
	hw := x.tail.HighWater()
	literal := subjectIsLiteral(subject)
	if literal {
		if seq, gen, ok := x.lastOf(subject, hw); ok {
			ix.m.lookups.WithLabelValues("hit").Inc()
			m, err := ix.shared(ctx, flightKey{stream: x.id, kind: bySeq, seq: seq}, func() (*pg.Message, error) {
				return ix.db.GetMessage(ctx, x.id, seq)
			})
			if !errors.Is(err, pg.ErrNotFound) {
				return m, err
			}
			// Gone since the index learned of it: only a full read can tell what is last now.
			x.forget(gen, subject, seq)
		} else {
			ix.m.lookups.WithLabelValues("miss").Inc()
		}
	}
	_, gen, _ := x.lastOf(subject, hw)
	m, err := ix.shared(ctx, flightKey{stream: x.id, kind: lastBySubj, subj: subject}, func() (*pg.Message, error) {
		return ix.db.LastBySubject(ctx, x.id, subject)
	})
	if err == nil && literal {
		x.fill(gen, subject, m.Seq)
	}
	return m, err
}

// tailGet answers a get by sequence from the tail: ok is false when memory cannot tell;
// live is false when the message is gone.
func (x *Index) tailGet(seq uint64) (m *pg.Message, live, ok bool) {
	if !x.trusted(seq) {
		return nil, false, false
	}
	cached, live, covered := x.tail.Get(seq)
	if !covered {
		return nil, false, false
	}
	return &cached, live, true
}

func subjectIsLiteral(subject string) bool {
	for i := 0; i < len(subject); i++ {
		if c := subject[i]; (c == '*' || c == '>') && (i == 0 || subject[i-1] == '.') && (i+1 == len(subject) || subject[i+1] == '.') {
			return false
		}
	}
	return true
}
