package bridge

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/pg"
)

// SubjectIndexBytesDefault bounds the in-memory index of the last sequence per subject, over
// all streams: enough for about a million keys of key-value buckets.
const SubjectIndexBytesDefault = 64 << 20

// subjectEntryBytes is what an index entry costs beyond its subject's bytes: the map's
// string header, sequence and bucket overhead.
const subjectEntryBytes = 48

// Gets (direct gets and STREAM.MSG.GET, key-value gets among them) are answered from
// memory where the message is there: by sequence from the stream's tail cache, the last of
// a subject through the subject index below and then the tail. Otherwise one indexed
// PostgreSQL read answers, shared by every identical get that arrives while it runs.
//
// The memory answers are as right as the tail and the index are: both learn every commit,
// purge, delete and retention move this process makes. Commits made by other replicas
// reach the tail with the next tick, and the index not at all: a get answered from memory
// on one replica may lag another replica's commits, as a JetStream direct get served by a
// follower may.
type getIndex struct {
	max  int64
	used atomic.Int64

	mu      sync.Mutex // a leaf: guards streams
	streams map[*stream]*lastSeqs

	flightMu sync.Mutex // a leaf: guards flights
	flights  map[getKey]*getFlight

	m getMetrics
}

// lastSeqs is one stream's last sequence per subject, and what limits what memory may
// answer.
type lastSeqs struct {
	mu   sync.Mutex // a leaf
	last map[string]uint64
	// bytes is what last holds, charged against getIndex.max.
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

type getMetrics struct {
	bytes     prometheus.GaugeFunc
	evictions prometheus.Counter
	lookups   *prometheus.CounterVec
	served    *prometheus.CounterVec
}

func newGetIndex(max int, reg prometheus.Registerer) *getIndex {
	g := &getIndex{max: int64(max), streams: make(map[*stream]*lastSeqs), flights: make(map[getKey]*getFlight)}
	g.m = getMetrics{
		bytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "jetgres_subject_index_bytes",
			Help: "Bytes held by the in-memory index of the last sequence per subject (bounded by --subject-index-bytes).",
		}, func() float64 { return float64(g.used.Load()) }),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_subject_index_evictions_total",
			Help: "Subjects dropped from the subject index, or not taken into it, because it reached --subject-index-bytes.",
		}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_subject_index_lookups_total",
			Help: "Last-by-subject gets looked up in the subject index, by result (hit, miss: read from PostgreSQL and filled).",
		}, []string{"result"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetgres_gets_total",
			Help: "Message gets (direct and STREAM.MSG.GET), by where the answer came from: memory, database, or shared (waited for an identical get's database read).",
		}, []string{"from"}),
	}
	for _, r := range []string{"hit", "miss"} {
		g.m.lookups.WithLabelValues(r)
	}
	for _, f := range []string{"memory", "database", "shared"} {
		g.m.served.WithLabelValues(f)
	}
	if reg != nil {
		reg.MustRegister(g.m.bytes, g.m.evictions, g.m.lookups, g.m.served)
	}
	return g
}

// of returns the stream's index, creating it empty.
func (g *getIndex) of(s *stream) *lastSeqs {
	g.mu.Lock()
	defer g.mu.Unlock()
	x := g.streams[s]
	if x == nil {
		x = &lastSeqs{last: make(map[string]uint64)}
		g.streams[s] = x
	}
	return x
}

// committed takes what one append committed: its new first sequence and the messages it
// stored, each now the last of its subject. The revisions that per-subject limits
// tombstoned belong to subjects of the same batch, whose entries move past them here.
func (g *getIndex) committed(s *stream, first, last uint64, stored []pg.Message) {
	x := g.of(s)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.first = max(x.first, first)
	x.seen = max(x.seen, last)
	for i := range stored {
		g.setLocked(x, stored[i].Subject, stored[i].Seq)
	}
}

// setLocked records seq as the last of subject unless a later one is known, evicting other
// subjects of the stream when the bound is reached.
func (g *getIndex) setLocked(x *lastSeqs, subject string, seq uint64) {
	if old, ok := x.last[subject]; ok {
		x.last[subject] = max(old, seq)
		return
	}
	cost := int64(len(subject) + subjectEntryBytes)
	var evicted int
	// Map order is random enough to evict by: any entry may go, a miss reads it back.
	for k := range x.last {
		if g.used.Load()+cost <= g.max {
			break
		}
		g.dropLocked(x, k)
		evicted++
	}
	if g.used.Load()+cost > g.max {
		evicted++ // the other streams' entries hold the bound: this one is not kept
	} else {
		x.last[subject] = seq
		x.bytes += cost
		g.used.Add(cost)
	}
	if evicted > 0 {
		g.m.evictions.Add(float64(evicted))
	}
}

func (g *getIndex) dropLocked(x *lastSeqs, subject string) {
	cost := int64(len(subject) + subjectEntryBytes)
	delete(x.last, subject)
	x.bytes -= cost
	g.used.Add(-cost)
}

// reset forgets every entry of the stream after messages were removed other than by the
// limits of an append (a purge, a delete, max_age, lowered limits, interest or workqueue
// retention). Entries come back one miss at a time. tailFrom, when positive, stops the tail
// from answering below it.
func (g *getIndex) reset(s *stream, tailFrom uint64) {
	x := g.of(s)
	x.mu.Lock()
	defer x.mu.Unlock()
	g.resetLocked(x)
	x.tailFrom = max(x.tailFrom, tailFrom)
}

func (g *getIndex) resetLocked(x *lastSeqs) {
	x.gen++
	g.used.Add(-x.bytes)
	x.last, x.bytes = make(map[string]uint64), 0
}

// retained takes what an interest or workqueue retention pass removed. The tail is left as
// it was for the consumers, which never go back; gets must not read what it holds of the
// removed messages.
func (b *Bridge) retained(s *stream, res pg.RetainResult) {
	switch {
	case res.Tombstoned > 0:
		b.gets.reset(s, s.tail.HighWater()+1)
		b.gets.moved(s, res.FirstSeq)
	case res.Removed > 0:
		b.gets.moved(s, res.FirstSeq)
	}
}

// moved records a new first sequence that retention reached without removing anything
// above it.
func (g *getIndex) moved(s *stream, first uint64) {
	x := g.of(s)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.first = max(x.first, first)
}

// drop forgets a deleted stream.
func (g *getIndex) drop(s *stream) {
	g.mu.Lock()
	x := g.streams[s]
	delete(g.streams, s)
	g.mu.Unlock()
	if x != nil {
		x.mu.Lock()
		g.used.Add(-x.bytes)
		x.last, x.bytes = nil, 0
		x.mu.Unlock()
	}
}

// lastOf returns the indexed last sequence of subject and the generation it belongs to. hw
// is the stream's high-water mark as this process knows it.
func (g *getIndex) lastOf(x *lastSeqs, subject string, hw uint64) (seq, gen uint64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if hw > x.seen {
		if x.last != nil {
			g.resetLocked(x)
		}
		x.seen = hw
	}
	seq, ok = x.last[subject]
	return seq, x.gen, ok && seq >= x.first
}

// fill records what PostgreSQL answered for subject, unless a reset came since gen.
func (g *getIndex) fill(x *lastSeqs, gen uint64, subject string, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.gen == gen && x.last != nil {
		g.setLocked(x, subject, seq)
	}
}

// forget drops subject's entry if it still says seq, which was found gone.
func (g *getIndex) forget(x *lastSeqs, gen uint64, subject string, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.gen == gen && x.last != nil && x.last[subject] == seq {
		g.dropLocked(x, subject)
	}
}

// trusted reports whether the tail's answer for seq may be given.
func (x *lastSeqs) trusted(seq uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return seq >= x.first && seq >= x.tailFrom
}

// getKey names a database read that identical gets share.
type getKey struct {
	s    *stream
	kind byte
	seq  uint64
	subj string
}

const (
	getBySeq byte = iota
	getLastBySubj
	getNextBySubj
)

// getFlight is a database read in flight; done closes when m and err are set.
type getFlight struct {
	done chan struct{}
	m    *pg.Message
	err  error
}

// shared runs read unless an identical one is in flight, then waits for that one's answer.
// The message is shared read-only.
func (g *getIndex) shared(ctx context.Context, k getKey, read func() (*pg.Message, error)) (*pg.Message, error) {
	g.flightMu.Lock()
	if f := g.flights[k]; f != nil {
		g.flightMu.Unlock()
		g.m.served.WithLabelValues("shared").Inc()
		select {
		case <-f.done:
			return f.m, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &getFlight{done: make(chan struct{})}
	g.flights[k] = f
	g.flightMu.Unlock()
	g.m.served.WithLabelValues("database").Inc()
	f.m, f.err = read()
	g.flightMu.Lock()
	delete(g.flights, k)
	g.flightMu.Unlock()
	close(f.done)
	return f.m, f.err
}

// storedMsg finds the message a get request names: the last of a subject, the next of a
// subject from a sequence, or the one at a sequence; pg.ErrNotFound when there is none.
func (b *Bridge) storedMsg(ctx context.Context, s *stream, req *server.JSApiMsgGetRequest) (*pg.Message, error) {
	g := b.gets
	if m, live, ok := b.memoryGet(s, req); ok {
		g.m.served.WithLabelValues("memory").Inc()
		if !live {
			return nil, pg.ErrNotFound
		}
		return m, nil
	}
	x := g.of(s)
	switch {
	case req.LastFor != "":
		return b.lastBySubject(ctx, s, x, req.LastFor)
	case req.NextFor != "":
		from := max(req.Seq, 1)
		return g.shared(ctx, getKey{s: s, kind: getNextBySubj, seq: from, subj: req.NextFor}, func() (*pg.Message, error) {
			return b.db.NextBySubject(ctx, s.id, req.NextFor, from)
		})
	default:
		return b.getBySeq(ctx, s, x, req.Seq)
	}
}

// memoryGet answers a single get from memory alone: ok is false when memory cannot tell,
// live is false when the message is gone. It counts only the index hit it answers with,
// so that a get it hands on is counted once, where it is answered.
func (b *Bridge) memoryGet(s *stream, req *server.JSApiMsgGetRequest) (m *pg.Message, live, ok bool) {
	g := b.gets
	x := g.of(s)
	switch {
	case req.LastFor != "":
		if !subjectIsLiteral(req.LastFor) {
			return nil, false, false
		}
		seq, _, found := g.lastOf(x, req.LastFor, s.tail.HighWater())
		if !found {
			return nil, false, false
		}
		if m, live, ok = b.tailGet(s, x, seq); !ok || !live {
			return nil, false, false
		}
		g.m.lookups.WithLabelValues("hit").Inc()
		return m, true, true
	case req.NextFor != "":
		from := max(req.Seq, 1)
		if !x.trusted(from) {
			return nil, false, false
		}
		cached, _, found, covered := s.tail.Next(from, func(subject string) bool { return matchAny([]string{req.NextFor}, subject) })
		if !covered || !found {
			return nil, false, false
		}
		return &cached, true, true
	default:
		return b.tailGet(s, x, req.Seq)
	}
}

// getBySeq returns the message at seq, from the tail if it is there.
func (b *Bridge) getBySeq(ctx context.Context, s *stream, x *lastSeqs, seq uint64) (*pg.Message, error) {
	g := b.gets
	if m, live, ok := b.tailGet(s, x, seq); ok {
		g.m.served.WithLabelValues("memory").Inc()
		if !live {
			return nil, pg.ErrNotFound
		}
		return m, nil
	}
	return g.shared(ctx, getKey{s: s, kind: getBySeq, seq: seq}, func() (*pg.Message, error) {
		return b.db.GetMessage(ctx, s.id, seq)
	})
}

// lastBySubject answers a last-by-subject get that memoryGet could not: a literal subject
// the index holds is one read by sequence, and a wildcard, or a subject the index does not
// hold, is one read of the newest match, which fills the index.
func (b *Bridge) lastBySubject(ctx context.Context, s *stream, x *lastSeqs, subject string) (*pg.Message, error) {
	g := b.gets
	hw := s.tail.HighWater()
	literal := subjectIsLiteral(subject)
	if literal {
		if seq, gen, ok := g.lastOf(x, subject, hw); ok {
			g.m.lookups.WithLabelValues("hit").Inc()
			m, err := g.shared(ctx, getKey{s: s, kind: getBySeq, seq: seq}, func() (*pg.Message, error) {
				return b.db.GetMessage(ctx, s.id, seq)
			})
			if !errors.Is(err, pg.ErrNotFound) {
				return m, err
			}
			// Gone since the index learned of it: only a full read can tell what is last now.
			g.forget(x, gen, subject, seq)
		} else {
			g.m.lookups.WithLabelValues("miss").Inc()
		}
	}
	_, gen, _ := g.lastOf(x, subject, hw)
	m, err := g.shared(ctx, getKey{s: s, kind: getLastBySubj, subj: subject}, func() (*pg.Message, error) {
		return b.db.LastBySubject(ctx, s.id, subject)
	})
	if err == nil && literal {
		g.fill(x, gen, subject, m.Seq)
	}
	return m, err
}

// tailGet answers a get by sequence from the tail cache: ok is false when memory cannot
// tell; live is false when the message is gone.
func (b *Bridge) tailGet(s *stream, x *lastSeqs, seq uint64) (m *pg.Message, live, ok bool) {
	if !x.trusted(seq) {
		return nil, false, false
	}
	cached, live, covered := s.tail.Get(seq)
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
