// Package gets answers message gets (direct gets and STREAM.MSG.GET, key-value gets among
// them) from memory where the message is there: by sequence from the stream's tail, the
// last of a subject through an index of the last sequence per subject and then the tail.
// Otherwise one indexed PostgreSQL read answers, shared by every identical get that arrives
// while it runs.
//
// It owns that index, for every stream under one byte bound, and the reads in flight. The
// tails are the streams' own: it only reads them. The stream tells each Index what its
// commits, purges and removals changed, and the memory answers are as right as the tail
// and the index are. Commits made by other replicas reach the tail with the next tick, and
// the index not at all: a get answered from memory on one replica may lag another
// replica's commits, as a JetStream direct get served by a follower may.
//
// # Locks
//
// Index.mu guards one stream's entries and Indexes.flightMu the reads in flight. Each is a
// leaf, taken one at a time, and a tail's lock (package tailcache) is taken with neither
// held. No lock is held across a database read.
package gets

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/pg"
)

// Store is what gets read from PostgreSQL when memory cannot answer; *pg.DB is one. Each
// returns pg.ErrNotFound when there is no such message.
type Store interface {
	GetMessage(ctx context.Context, streamID int64, seq uint64) (*pg.Message, error)
	LastBySubject(ctx context.Context, streamID int64, filter string) (*pg.Message, error)
	NextBySubject(ctx context.Context, streamID int64, filter string, from uint64) (*pg.Message, error)
}

// entryBytes is what an index entry costs beyond its subject's bytes: the map's string
// header, sequence and bucket overhead.
const entryBytes = 48

// Indexes is what every stream's Index shares: the byte bound of their entries, the reads
// in flight and the metrics.
type Indexes struct {
	db   Store
	max  int64
	used atomic.Int64

	flightMu sync.Mutex // a leaf: guards flights
	flights  map[flightKey]*flight

	m getMetrics
}

type getMetrics struct {
	bytes     prometheus.GaugeFunc
	evictions prometheus.Counter
	lookups   *prometheus.CounterVec
	served    *prometheus.CounterVec
}

// New returns the indexes of a process's streams, whose entries hold at most maxBytes
// together, reading db when memory cannot answer, with their metrics registered with reg
// unless it is nil.
func New(db Store, maxBytes int, reg prometheus.Registerer) *Indexes {
	ix := &Indexes{db: db, max: int64(maxBytes), flights: make(map[flightKey]*flight)}
	ix.m = getMetrics{
		bytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "jetgres_subject_index_bytes",
			Help: "Bytes held by the in-memory index of the last sequence per subject (bounded by --subject-index-bytes).",
		}, func() float64 { return float64(ix.used.Load()) }),
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
		ix.m.lookups.WithLabelValues(r)
	}
	for _, f := range []string{"memory", "database", "shared"} {
		ix.m.served.WithLabelValues(f)
	}
	if reg != nil {
		reg.MustRegister(ix.m.bytes, ix.m.evictions, ix.m.lookups, ix.m.served)
	}
	return ix
}

// Open returns the empty index of stream id, whose tail is tail.
func (ix *Indexes) Open(id int64, tail *tailcache.Tail) *Index {
	return &Index{ix: ix, id: id, tail: tail, last: make(map[string]uint64)}
}

// flightKey names a database read that identical gets share.
type flightKey struct {
	stream int64
	kind   byte
	seq    uint64
	subj   string
}

const (
	bySeq byte = iota
	lastBySubj
	nextBySubj
)

// flight is a database read in flight; done closes when m and err are set.
type flight struct {
	done chan struct{}
	m    *pg.Message
	err  error
}

// shared runs read unless an identical one is in flight, then waits for that one's answer.
// The message is shared read-only.
func (ix *Indexes) shared(ctx context.Context, k flightKey, read func() (*pg.Message, error)) (*pg.Message, error) {
	ix.flightMu.Lock()
	if f := ix.flights[k]; f != nil {
		ix.flightMu.Unlock()
		ix.m.served.WithLabelValues("shared").Inc()
		select {
		case <-f.done:
			return f.m, f.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	ix.flights[k] = f
	ix.flightMu.Unlock()
	ix.m.served.WithLabelValues("database").Inc()
	f.m, f.err = read()
	ix.flightMu.Lock()
	delete(ix.flights, k)
	ix.flightMu.Unlock()
	close(f.done)
	return f.m, f.err
}
