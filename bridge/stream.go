package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/gets"
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// stream is one JetStream stream as this process serves it.
type stream struct {
	id      int64
	name    string
	created time.Time
	ackPfx  []byte

	// cfg is replaced whole, never changed in place: every publish and ack reads it, and
	// a copy of the struct per message cost more than the rest of the check.
	cfg   atomic.Pointer[server.StreamConfig]
	cfgMu sync.Mutex // guards subs
	subs  []*leaf.Subscription

	in  intake
	ret retentionState // interest and workqueue retention, see retention.go

	// tail is the stream's newest committed messages in memory: publishes put theirs there,
	// consumers that keep up and gets read them there. It is made with the stream and
	// starts when it is first needed (see tailcache.New).
	tail *tailcache.Tail
	// gets answers gets of the stream's messages from its tail and its last sequence per
	// subject, or from PostgreSQL.
	gets *gets.Index
	// subscribers take the stream's events (events.go): the bridge's, shared by every
	// stream and never changed, so that dispatch reads them without a lock.
	subscribers []subscriber

	// chunkRows overrides pg.ChunkRowsDefault for this stream's new chunks when positive:
	// smaller chunks give space back sooner at the cost of more tables.
	chunkRows atomic.Int64
}

// ID, Name and ConfigView are what the engines outside this package (bridge/gets,
// retention, the SQL mover) read of a stream through their own narrow interfaces.
func (s *stream) ID() int64 { return s.id }

func (s *stream) Name() string { return s.name }

// ConfigView is the stream's configuration, for reading only.
func (s *stream) ConfigView() *server.StreamConfig { return s.cfg.Load() }

// config returns a copy of the stream's configuration, for callers that keep or change it.
func (s *stream) config() server.StreamConfig { return *s.cfg.Load() }

// cfgView returns the stream's configuration for reading only.
func (s *stream) cfgView() *server.StreamConfig { return s.cfg.Load() }

func (s *stream) setConfig(cfg server.StreamConfig) { s.cfg.Store(&cfg) }

func (s *stream) unsubscribe() {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	s.unsubscribeLocked()
}

// unsubscribeLocked drops the stream's subject interest; cfgMu is held.
func (s *stream) unsubscribeLocked() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// subscribe registers interest in the stream's subjects on the link, replacing any it had.
func (b *Bridge) subscribe(s *stream) error {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	s.unsubscribeLocked()
	for _, subj := range s.cfgView().Subjects {
		sub, err := b.link.Subscribe(subj, QueueGroup, func(m *leaf.Msg) { b.onPublish(s, m) })
		if err != nil {
			return fmt.Errorf("subscribe %q: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	return nil
}

func (b *Bridge) lookup(name string) *stream {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.streams[name]
}

// lookupOrSync finds a stream, re-reading the list from PostgreSQL once if it is unknown
// here and PostgreSQL has it: another replica may have just created it. A name PostgreSQL
// does not have costs one read by that name, and neither the admin lock nor a read of
// every stream, so that requests for unknown streams cannot keep the API workers waiting.
// It returns pg.ErrNotFound only when PostgreSQL answered without it, and the database's
// error when it could not be read.
func (b *Bridge) lookupOrSync(ctx context.Context, name string) (*stream, error) {
	return b.findStored(ctx, name, true)
}

// lookupLocked is lookupOrSync for a caller that holds adminMu.
func (b *Bridge) lookupLocked(ctx context.Context, name string) (*stream, error) {
	return b.findStored(ctx, name, false)
}

func (b *Bridge) findStored(ctx context.Context, name string, lock bool) (*stream, error) {
	if s := b.lookup(name); s != nil {
		return s, nil
	}
	switch stored, err := b.db.StreamNamed(ctx, name); {
	case err != nil:
		return nil, err
	case !stored:
		return nil, pg.ErrNotFound
	}
	if lock {
		b.adminMu.Lock()
		defer b.adminMu.Unlock()
	}
	if err := b.syncStreamsLocked(ctx); err != nil {
		return nil, fmt.Errorf("re-reading streams: %w", err)
	}
	if s := b.lookup(name); s != nil {
		return s, nil
	}
	return nil, pg.ErrNotFound
}

func (b *Bridge) streamList() []*stream {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Values(b.streams))
}

// syncStreams makes the served streams agree with PostgreSQL.
func (b *Bridge) syncStreams(ctx context.Context) error {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	return b.syncStreamsLocked(ctx)
}

func (b *Bridge) syncStreamsLocked(ctx context.Context) error {
	stored, err := b.db.Streams(ctx)
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(stored))
	for _, st := range stored {
		seen[st.Name] = true
		var cfg server.StreamConfig
		if err := json.Unmarshal(st.Config, &cfg); err != nil {
			b.log.Error("stored stream config does not decode", "stream", st.Name, "err", err)
			continue
		}
		cur := b.lookup(st.Name)
		switch {
		case cur == nil || cur.id != st.ID:
			if cur != nil {
				b.removeStream(cur)
			}
			if err := b.addStream(st, cfg); err != nil {
				return err
			}
		default:
			moved := !slices.Equal(cur.config().Subjects, cfg.Subjects)
			cur.setConfig(cfg)
			if moved {
				if err := b.subscribe(cur); err != nil {
					return err
				}
			}
		}
	}
	for _, s := range b.streamList() {
		if !seen[s.name] {
			b.removeStream(s)
		}
	}
	return nil
}

func (b *Bridge) addStream(st pg.Stream, cfg server.StreamConfig) error {
	s := &stream{id: st.ID, name: st.Name, created: st.Created, ackPfx: jswire.PubAckPrefix(st.Name),
		tail: tailcache.New(TailBytesDefault, b.tails)}
	s.gets = b.gets.Open(s.id, s.tail)
	s.subscribers = b.subscribers
	s.setConfig(cfg)
	b.mu.Lock()
	b.streams[s.name] = s
	b.mu.Unlock()
	if err := b.subscribe(s); err != nil {
		return fmt.Errorf("stream %q: %w", s.name, err)
	}
	return nil
}

func (b *Bridge) removeStream(s *stream) {
	s.unsubscribe()
	b.mu.Lock()
	if b.streams[s.name] == s {
		delete(b.streams, s.name)
	}
	b.mu.Unlock()
	s.drop()
	b.closeIntake(s, server.NewJSStreamNotFoundError())
}

// errOverlap is the overlap check's refusal.
var errOverlap = errors.New("subjects overlap with an existing stream")

// overlapCheck is the subject-overlap check as PostgreSQL decides it: run in the transaction
// that stores a stream, on every other stream stored, under a lock that serialises stream
// creation across replicas, so two replicas cannot both create overlapping streams.
func (b *Bridge) overlapCheck(subjects []string) pg.StreamCheck {
	return func(others []pg.Stream) error {
		for _, o := range others {
			var cfg server.StreamConfig
			if err := json.Unmarshal(o.Config, &cfg); err != nil {
				return fmt.Errorf("stored config of stream %q: %w", o.Name, err)
			}
			if subjectsCollide(cfg.Subjects, subjects) {
				return errOverlap
			}
		}
		return nil
	}
}

// overlapping reports the first stream other than name whose subjects collide with subjects.
func (b *Bridge) overlapping(name string, subjects []string) *stream {
	for _, s := range b.streamList() {
		if s.name == name {
			continue
		}
		if subjectsCollide(s.config().Subjects, subjects) {
			return s
		}
	}
	return nil
}

// subjectsCollide reports whether a subject of as and one of bs can match the same message.
func subjectsCollide(as, bs []string) bool {
	for _, a := range as {
		for _, b := range bs {
			if server.SubjectsCollide(a, b) {
				return true
			}
		}
	}
	return false
}

// registerTailMetrics registers what the streams' tails hold together under their shared
// bound.
func registerTailMetrics(reg prometheus.Registerer, tails *tailcache.Budget) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_tail_cache_bytes",
			Help: "Bytes held by all streams' tail caches together (bounded by --tail-total-bytes)."},
			func() float64 { return float64(tails.Used()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "jetgres_tail_cache_total_evictions_total",
			Help: "Messages evicted from a tail cache below its own bound because all tail caches together reached --tail-total-bytes."},
			func() float64 { return float64(tails.Evicted()) }))
}
