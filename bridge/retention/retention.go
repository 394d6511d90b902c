// Package retention removes what the streams no longer keep. It applies interest and
// workqueue retention (a message goes once every consumer that wants it has acknowledged
// it), max_age, message TTLs (Nats-TTL) with the subject delete markers nats-server
// leaves where expiry empties a subject, and the limits an update lowers, and it gives
// space back: it drops the chunk tables no stream reads any more and those no stream
// lists, and prunes de-duplication ids past their window. It also answers the two questions that need its
// view of every replica's consumers: which publishes to an interest stream no consumer
// wants, and whether a new consumer would share a work queue's messages with another.
//
// It owns, for each stream, the acks seen on the link since the last retention pass, what
// that pass applied, and the filters of the consumers other replicas serve. The streams,
// the consumers this process serves and the announcing of what went are the bridge's,
// reached through Host; PostgreSQL through Store.
//
// # Goroutine
//
// The maintainer is one goroutine, from Start until Stop. It runs a pass on the streams
// with acks or consumer changes as they come, again soon while a pass left acks that their
// consumer had yet to apply, and once a maintainPeriod it refreshes the storage usage,
// runs a pass on every interest and workqueue stream, applies max_age and message TTLs
// (storing markers through Host.Mark, with no lock held), closes the chunks of slow limited
// streams and of streams with a max_age (pg.CloseChunks), drops chunks, prunes ids and
// forgets the streams that are gone. Its database calls take no flow-lane
// permit, and each transaction it opens is short. Settle, ApplyLimits and the checks run
// on their callers' goroutines.
//
// # Locks
//
// In the order in which they may be held together:
//
//  1. streamState.run lets one pass run on a stream at a time and guards what the last pass
//     applied. A pass holds it across its two database calls (the consumers, then the
//     removal) and while it asks Host for the consumers this process serves and announces
//     what it removed: the next pass starts from what this one applied, and Settle waits
//     on it so that no stream info answers between a pass taking acks and their messages
//     going.
//  2. streamState.mu guards the acks noted for the next pass, whether one is due, and the other
//     replicas' filters. A leaf.
//
// Enforcer.mu guards the map of states; it is a leaf taken with neither of the others held.
// The warnings' throttle has a leaf lock of its own (package warnlog).
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

// Store is what retention reads and changes in PostgreSQL; *pg.DB is one. Its calls run
// as background work, outside the flow lanes. A stream that is gone makes those by its id
// fail with pg.ErrNotFound.
type Store interface {
	Consumers(ctx context.Context, streamID int64) ([]pg.Consumer, error)
	Retain(ctx context.Context, p pg.RetainParams) (pg.RetainResult, error)
	InterestGone(ctx context.Context, id int64) error
	ExpireOlder(ctx context.Context, id int64, cutoff int64) (uint64, error)
	Expire(ctx context.Context, p pg.ExpireParams) (pg.ExpireResult, error)
	EnforceLimits(ctx context.Context, id int64, lim pg.Limits) (uint64, error)
	PruneMsgIDs(ctx context.Context, id int64, cutoff int64) (int64, error)
	ChunkDropCandidates(ctx context.Context, idle time.Duration) ([]int64, error)
	DropChunks(ctx context.Context, id int64, idle time.Duration) (int, error)
	CloseChunks(ctx context.Context, closes []pg.ChunkClose) (int, error)
	ReapChunks(ctx context.Context) (int, error)
}

// StreamView is what retention reads of a stream. The engine keeps its state by ID.
type StreamView interface {
	ID() int64
	Name() string
	// ConfigView is the stream's configuration now, for reading only.
	ConfigView() *server.StreamConfig
	// FlushSince is when the stream's flush in flight started, in Unix nanoseconds of the
	// engine's clock, 0 when none is.
	FlushSince() int64
	// ChunkCloseRows is the size at which the maintainer closes the stream's chunks once
	// they are pg.ChunkCloseAge old, 0 for none (pg.ChunkRowsClose).
	ChunkCloseRows() int64
}

// Host is what retention needs of the bridge that runs it: the streams, the consumers this
// process serves, and the announcing of what went. A pass calls Served, Purged and Removed
// with its lock held (see the package doc); no method may call back into the Enforcer.
type Host[S StreamView] interface {
	// Streams lists the streams this process serves.
	Streams() []S
	// Served reports the progress of the consumer row describes, if this process serves
	// it: that consumer, not an older one of the same name.
	Served(s S, row pg.Consumer) (ConsumerProgress, bool)
	// LocalFilters lists the filters (jswire.ConsumerFilters) of each consumer of s this
	// process serves, as they are now.
	LocalFilters(s S) [][]string
	// Purged announces that messages of s went that readers may hold in memory: first is
	// the stream's first sequence afterwards, 0 when unknown; consumed says only what
	// every consumer had done with went, by a work queue's retention.
	Purged(ctx context.Context, s S, first uint64, consumed bool)
	// Removed announces that the first sequence of s moved to first past messages every
	// consumer had done with, none of which a reader needs to forget.
	Removed(s S, first uint64)
	// RefreshUsage reads anew what the streams hold, for the storage bounds.
	RefreshUsage(ctx context.Context) error
	// Mark stores a subject delete marker with the given TTL in place of each of last, the
	// last messages of their subjects, which expired, unless a message was stored on the
	// subject since; it reports how many it stored.
	Mark(ctx context.Context, s S, last []pg.Message, ttl time.Duration) (int, error)
}

// ConsumerProgress is what a pass needs of a consumer this process serves.
type ConsumerProgress struct {
	// Floor is its ack floor's stream sequence: everything at or below it is done with.
	Floor uint64
	// Next is the next stream sequence it would consider.
	Next uint64
	// Pending are the delivered sequences still waiting for an ack, in order.
	Pending []uint64
}

// Config configures an Enforcer. Store and Host are required.
type Config[S StreamView] struct {
	Store Store
	Host  Host[S]
	// Logger receives the engine's warnings. Defaults to discarding them.
	Logger *slog.Logger
	// Clock drives the maintainer and tells the time max_age and the id windows measure
	// back from. Nil means the system clock.
	Clock clock.Clock
	// Registerer receives jetgres_retention_passes_total and the expiry counters (ttl.go).
	// Nil registers nothing.
	Registerer prometheus.Registerer
}

func (c *Config[S]) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("Config.Store is required"))
	}
	if c.Host == nil {
		errs = append(errs, errors.New("Config.Host is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	return nil
}

// Enforcer is the retention of every stream a process serves. Until Start, and after Stop,
// it notes no acks and Settle runs no pass; the other methods work throughout.
type Enforcer[S StreamView] struct {
	store  Store
	host   Host[S]
	log    *slog.Logger
	clock  clock.Clock
	passes prometheus.Counter
	ttl    ttlMetrics

	run     startstop.Group
	running atomic.Bool
	kick    chan struct{}

	mu     sync.Mutex // guards states; a leaf
	states map[int64]*streamState

	// Only the maintainer's goroutine touches these.
	pruned map[int64]time.Time // when each stream's ids were last pruned, by stream id
	reaped time.Time           // when orphaned chunk tables were last looked for
	// warn thins the jobs' failure warnings: while the database is away every job fails for
	// every stream on every pass.
	warn warnlog.Throttle
}

// streamState is a stream's interest and workqueue retention streamState.
type streamState struct {
	mu    sync.Mutex
	acked map[string][]uint64 // acks seen on the link, by consumer, not yet settled
	// dirty says a pass is due: acks were seen, or consumers came, went or changed, since the
	// last one began; waiting, that the last pass left acks for their consumer to apply.
	dirty   bool
	waiting bool
	remote  [][]string // filters of the consumers other replicas serve, as of the last pass

	run     sync.Mutex        // serialises passes
	applied map[string]uint64 // the floors the last pass applied, by consumer
	sig     string            // the consumers and filters the last pass saw
}

// New checks the configuration, registers the engine's metric and returns the engine,
// not yet started.
func New[S StreamView](cfg Config[S]) (*Enforcer[S], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Enforcer[S]{
		store: cfg.Store,
		host:  cfg.Host,
		log:   log,
		clock: clock.OrSystem(cfg.Clock),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_retention_passes_total",
			Help: "Retention passes over interest and work-queue streams: each reads the stream's consumers and removes what none of them needs.",
		}),
		ttl:    newTTLMetrics(cfg.Registerer),
		kick:   make(chan struct{}, 1),
		states: make(map[int64]*streamState),
		pruned: make(map[int64]time.Time),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(e.passes)
	}
	return e, nil
}

// Start reads what the streams hold, for the storage bounds, makes the engine note acks
// for its passes, and starts the maintainer, which runs until Stop or until ctx ends.
// Before, retention still follows the consumers' ack floors, and only acks above a floor
// wait for it. An engine starts once: a second Start fails, and so does a Start after Stop.
func (e *Enforcer[S]) Start(ctx context.Context) error {
	ctx, err := e.run.Start(ctx)
	if err != nil {
		return fmt.Errorf("retention: start: %w", err)
	}
	if err := e.host.RefreshUsage(ctx); err != nil {
		e.log.Warn("reading what the streams hold failed; the storage bounds apply from the next pass", "err", err)
	}
	e.running.Store(true)
	e.run.Go(func() { e.maintain(ctx) })
	return nil
}

// Stop stops the maintainer and returns once it has; from then on the engine notes no
// acks and Settle runs no pass. A pass in flight is cancelled. Stop is safe to call twice
// and before Start.
func (e *Enforcer[S]) Stop() {
	e.run.Stop()
	e.running.Store(false)
}

// state returns the retention state of s, made on first use.
func (e *Enforcer[S]) state(s S) *streamState {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.states[s.ID()]
	if st == nil {
		st = &streamState{}
		e.states[s.ID()] = st
	}
	return st
}

// NoteAck runs on the link's read loop, from the consumers' ack handler, for every ack
// whether or not this process serves the consumer: it notes which messages were
// acknowledged, for the next retention pass. The consumer decides whether the ack counts;
// the pass asks it. consumer is kept, so it must not be borrowed memory.
func (e *Enforcer[S]) NoteAck(s S, consumer string, sseq uint64, body []byte) {
	if !e.running.Load() || !jswire.AckSettles(body) || s.ConfigView().Retention == server.LimitsPolicy {
		return
	}
	st := e.state(s)
	st.mu.Lock()
	if st.acked == nil {
		st.acked = make(map[string][]uint64)
	}
	st.acked[consumer] = append(st.acked[consumer], sseq)
	st.dirty = true
	st.mu.Unlock()
	e.wake()
}

func (e *Enforcer[S]) wake() { wake.Poke(e.kick) }

// Stale makes a retention pass over s due soon: its consumers came, went or changed what
// they want.
func (e *Enforcer[S]) Stale(s S) {
	if s.ConfigView().Retention == server.LimitsPolicy {
		return
	}
	st := e.state(s)
	st.mu.Lock()
	st.dirty = true
	st.mu.Unlock()
	if e.running.Load() {
		e.wake()
	}
}

// ConsumerDeleted follows a consumer's deletion from s. It marks an interest stream that
// lost its last consumer as JetStream does, which purges it then: one that never held a
// message reports first_seq 1 from there on.
func (e *Enforcer[S]) ConsumerDeleted(ctx context.Context, s S) {
	e.Stale(s)
	if s.ConfigView().Retention != server.InterestPolicy {
		return
	}
	if err := e.store.InterestGone(ctx, s.ID()); err != nil && ctx.Err() == nil {
		e.log.Warn("marking an interest stream without consumers failed", "stream", s.Name(), "err", err)
	}
}

// Settle runs a retention pass on s now if one is due, so that what a client reads next
// reflects every ack the consumers have applied. A stream with nothing due costs nothing:
// a stream info on a quiet interest or work-queue stream reads no consumer.
func (e *Enforcer[S]) Settle(ctx context.Context, s S) error {
	if s.ConfigView().Retention == server.LimitsPolicy || !e.running.Load() {
		return nil
	}
	st := e.state(s)
	// A pass in flight may have taken the acks before their messages are gone: wait it out.
	st.run.Lock()
	st.mu.Lock()
	due := st.dirty || st.waiting
	st.mu.Unlock()
	st.run.Unlock()
	if !due {
		return nil
	}
	_, err := e.retain(ctx, s)
	return err
}

// PolicyChanged makes the next pass over s look at every message again: under the policy
// it had, messages were kept for reasons the new one does not know.
func (e *Enforcer[S]) PolicyChanged(s S) {
	st := e.state(s)
	st.run.Lock()
	st.sig = ""
	st.run.Unlock()
}

// NoInterest reports, for an interest stream, which of the given subjects no consumer's
// filter matches: JetStream gives such a publish a sequence and stores nothing. Consumers
// this process serves are known at once; those other replicas serve, as of the last
// retention pass.
func (e *Enforcer[S]) NoInterest(s S, subjects []string) []bool {
	local := e.host.LocalFilters(s)
	st := e.state(s)
	st.mu.Lock()
	remote := st.remote
	st.mu.Unlock()
	out := make([]bool, len(subjects))
	for i, subj := range subjects {
		wants := func(f []string) bool { return jswire.FiltersMatch(f, subj) }
		out[i] = !slices.ContainsFunc(local, wants) && !slices.ContainsFunc(remote, wants)
	}
	return out
}

// forget drops the state of the streams that are gone. Only states made before the
// streams were listed can go: one made since may be a new stream's that the list missed.
// A state made again for a stream that is gone, by a call that raced its deletion, goes
// at the next look.
func (e *Enforcer[S]) forget() {
	e.mu.Lock()
	ids := make([]int64, 0, len(e.states))
	for id := range e.states {
		ids = append(ids, id)
	}
	e.mu.Unlock()
	live := make(map[int64]bool)
	for _, s := range e.host.Streams() {
		live[s.ID()] = true
	}
	e.mu.Lock()
	for _, id := range ids {
		if !live[id] {
			delete(e.states, id)
		}
	}
	e.mu.Unlock()
}
