package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

// Store is what the registry and its flushes ask of PostgreSQL; *pg.DB is one.
type Store interface {
	Append(ctx context.Context, batches []pg.AppendBatch, ts int64) ([]pg.AppendResult, time.Duration, error)
	Resolve(ctx context.Context, e *pg.OutcomeUnknownError) (pg.Resolution, error)
	Streams(ctx context.Context) ([]pg.StreamRow, error)
	StreamNamed(ctx context.Context, name string) (bool, error)
	AllTotals(ctx context.Context) (map[int64]pg.StreamTotals, error)
}

// Config configures a Registry. Every field is required and taken as given: the bridge
// validates its own configuration and fills this one from it.
type Config struct {
	DB         Store
	Link       *leaf.Conn
	Append     *flow.Lane // the lane every flush takes a permit of
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil registers nothing
	// QueueGroup is the queue group of the streams' subject subscriptions, shared by every
	// replica, so that each publish is taken by one.
	QueueGroup string
	// IntakeBytes bounds each stream's intake, IntakeTotalBytes all of them together.
	IntakeBytes, IntakeTotalBytes int
	// FlushMaxMsgs caps one stream's messages per transaction, FlushMaxStreams the streams
	// that share one.
	FlushMaxMsgs, FlushMaxStreams int
	// FlushOverlapAfter is how long an append transaction runs alone before the next may start
	// beside it.
	FlushOverlapAfter time.Duration
	// MaxMemory and MaxStore bound the bytes of memory and of file streams; 0 is no bound.
	MaxMemory, MaxStore int64
	// TailBytes bounds each stream's tail, Tails all of them together.
	TailBytes int
	Tails     *tailcache.Budget
	// Gets makes each stream's get index.
	Gets *gets.Indexes
	// NoInterest says, for messages bound for an interest stream, which of their subjects no
	// consumer wants: those are not stored.
	NoInterest func(s *Stream, subjects []string) []bool
	// Domain is the JetStream domain that PubAcks name; "" names none.
	Domain string
}

// Registry is the streams this process serves, kept as PostgreSQL stores them, and the
// append transactions that commit what they take in.
type Registry struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	// warnAppend thins the warnings of flushes that fail together while the database is away.
	warnAppend warnlog.Throttle

	adminMu sync.Mutex
	mu      sync.RWMutex
	streams map[string]*Stream
	// subscribers take every stream's events after its get index and tail (events.go).
	subscribers []Subscriber

	ready *readyQueue
	usage storeUsage // what memory and file streams hold, for Config.MaxMemory and MaxStore
	// inFlight counts the append transactions in flight; youngest is when the last of them
	// started, in the clock's Unix nanoseconds; flushDone is poked as each ends.
	inFlight    atomic.Int32
	youngest    atomic.Int64
	flushDone   chan struct{}
	intakeTotal atomic.Int64 // bytes in all streams' intakes
	batchAcct   batchAccount // what all streams' atomic batches stage

	// dispatch runs the flush dispatcher; ctx is its context. flushes runs the append
	// transactions, which outlive the dispatcher so that what was taken in is committed and
	// answered; flushCtx ends only when Stop's deadline passes.
	dispatch startstop.Group
	ctx      context.Context
	flushes  startstop.Group
	flushCtx context.Context
}

// NewRegistry builds an empty registry; Start makes it flush, Sync fills it.
func NewRegistry(cfg Config) *Registry {
	r := &Registry{
		cfg:       cfg,
		log:       cfg.Logger,
		m:         newMetrics(cfg.Registerer),
		streams:   make(map[string]*Stream),
		ready:     newReadyQueue(),
		flushDone: make(chan struct{}, 1),
	}
	r.subscribers = []Subscriber{getSubscriber{}, tailSubscriber{}}
	registerTailMetrics(cfg.Registerer, cfg.Tails)
	registerIntakeMetrics(cfg.Registerer, r)
	return r
}

// Subscribe adds subscribers of every stream's events, after the get index and the tail,
// in the order given. Called before Start.
func (r *Registry) Subscribe(subs ...Subscriber) {
	r.subscribers = append(r.subscribers, subs...)
}

// Start starts the flush dispatcher. ctx bounds nothing after it returns.
func (r *Registry) Start(ctx context.Context) error {
	var err error
	if r.ctx, err = r.dispatch.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("stream: start: %w", err)
	}
	if r.flushCtx, err = r.flushes.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("stream: start: %w", err)
	}
	r.dispatch.Go(r.dispatchFlushes)
	return nil
}

// UnsubscribeAll drops every stream's subject interest: nothing more is taken in.
func (r *Registry) UnsubscribeAll() {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, s := range r.streams {
		s.unsubscribe()
	}
}

// Stop commits and answers everything taken in, then stops the dispatcher and waits for the
// flushes in flight. ctx bounds the drain: once it ends, the flushes still in flight are
// cancelled (their publishers get an error or no answer). Every goroutine the registry
// started has returned when it does. Call UnsubscribeAll first.
func (r *Registry) Stop(ctx context.Context) error {
	var err error
	if e := r.drain(ctx); e != nil {
		err = fmt.Errorf("drain: %w", e)
	}
	r.dispatch.Stop()
	// The dispatcher may have started a last flush after the drain looked.
	if e := r.flushes.Wait(ctx); e != nil && err == nil {
		err = fmt.Errorf("drain: %w", e)
	}
	r.flushes.Stop()
	return err
}

// Wait returns once every goroutine the registry started has returned (none runs once Stop
// returned), or with ctx's error.
func (r *Registry) Wait(ctx context.Context) error {
	if err := r.dispatch.Wait(ctx); err != nil {
		return err
	}
	return r.flushes.Wait(ctx)
}

// OldestFlush is how long the oldest append transaction still in flight has been running at
// now, a time of the registry's clock, or 0 when none is. A commit that hangs (a row lock
// held elsewhere, a saturated disk) shows here while every publish it carries waits for its
// PubAck. Only served streams are looked at: a flush of a stream deleted meanwhile no
// longer counts.
func (r *Registry) OldestFlush(now time.Time) time.Duration {
	var oldest int64
	r.mu.RLock()
	for _, s := range r.streams {
		if t := s.in.flushSince.Load(); t != 0 && (oldest == 0 || t < oldest) {
			oldest = t
		}
	}
	r.mu.RUnlock()
	if oldest == 0 {
		return 0
	}
	return max(now.Sub(time.Unix(0, oldest)), 0)
}

// LockAdmin takes the admin lock, which serialises stream create, update and delete and the
// re-reading of the streams, so that overlap checks and the subject subscriptions agree
// with what PostgreSQL holds. The holder may call the Locked variants.
func (r *Registry) LockAdmin() { r.adminMu.Lock() }

// UnlockAdmin gives the admin lock back.
func (r *Registry) UnlockAdmin() { r.adminMu.Unlock() }

// Lookup returns the served stream called name, nil when there is none.
func (r *Registry) Lookup(name string) *Stream {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.streams[name]
}

// Find finds a stream, re-reading the list from PostgreSQL once if it is unknown here and
// PostgreSQL has it: another replica may have just created it. A name PostgreSQL does not
// have costs one read by that name, and neither the admin lock nor a read of every stream,
// so that requests for unknown streams cannot keep the API workers waiting. It returns
// pg.ErrNotFound only when PostgreSQL answered without it, and the database's error when it
// could not be read.
func (r *Registry) Find(ctx context.Context, name string) (*Stream, error) {
	return r.find(ctx, name, true)
}

// FindLocked is Find for a caller that holds the admin lock.
func (r *Registry) FindLocked(ctx context.Context, name string) (*Stream, error) {
	return r.find(ctx, name, false)
}

func (r *Registry) find(ctx context.Context, name string, lock bool) (*Stream, error) {
	if s := r.Lookup(name); s != nil {
		return s, nil
	}
	switch stored, err := r.cfg.DB.StreamNamed(ctx, name); {
	case err != nil:
		return nil, err
	case !stored:
		return nil, pg.ErrNotFound
	}
	if lock {
		r.adminMu.Lock()
		defer r.adminMu.Unlock()
	}
	if err := r.SyncLocked(ctx); err != nil {
		return nil, fmt.Errorf("re-reading streams: %w", err)
	}
	if s := r.Lookup(name); s != nil {
		return s, nil
	}
	return nil, pg.ErrNotFound
}

// List returns every served stream, in no order.
func (r *Registry) List() []*Stream {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Collect(maps.Values(r.streams))
}

// Sync makes the served streams agree with PostgreSQL.
func (r *Registry) Sync(ctx context.Context) error {
	r.adminMu.Lock()
	defer r.adminMu.Unlock()
	return r.SyncLocked(ctx)
}

// SyncLocked is Sync for a caller that holds the admin lock.
func (r *Registry) SyncLocked(ctx context.Context) error {
	stored, err := r.cfg.DB.Streams(ctx)
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(stored))
	for _, st := range stored {
		seen[st.Name] = true
		var cfg server.StreamConfig
		if err := json.Unmarshal(st.Config, &cfg); err != nil {
			r.log.Error("stored stream config does not decode", "stream", st.Name, "err", err)
			continue
		}
		cur := r.Lookup(st.Name)
		switch {
		case cur == nil || cur.id != st.ID:
			if cur != nil {
				r.Remove(cur)
			}
			if _, err := r.Add(st, cfg); err != nil {
				return err
			}
		default:
			moved := !slices.Equal(cur.Config().Subjects, cfg.Subjects)
			cur.SetConfig(cfg)
			if moved {
				if err := r.Resubscribe(cur); err != nil {
					return err
				}
			}
		}
	}
	for _, s := range r.List() {
		if !seen[s.name] {
			r.Remove(s)
		}
	}
	return nil
}

// Add serves a stored stream: it makes its tail and get index and subscribes its subjects.
// Called with the admin lock held.
func (r *Registry) Add(st pg.StreamRow, cfg server.StreamConfig) (*Stream, error) {
	s := &Stream{id: st.ID, name: st.Name, created: st.Created, ackPfx: jswire.PubAckPrefixIn(st.Name, r.cfg.Domain),
		tail: tailcache.New(r.cfg.TailBytes, r.cfg.Tails)}
	s.gets = r.cfg.Gets.Open(s.id, s.tail)
	s.subscribers = r.subscribers
	s.SetConfig(cfg)
	r.mu.Lock()
	r.streams[s.name] = s
	r.mu.Unlock()
	if err := r.Resubscribe(s); err != nil {
		return nil, fmt.Errorf("stream %q: %w", s.name, err)
	}
	return s, nil
}

// Resubscribe subscribes the stream's subjects as its configuration now has them.
func (r *Registry) Resubscribe(s *Stream) error {
	return s.subscribe(r.cfg.Link, r.cfg.QueueGroup, r.onPublish)
}

// Unsubscribe drops the stream's subject interest, for a delete that may still fail:
// Resubscribe takes it back.
func (r *Registry) Unsubscribe(s *Stream) { s.unsubscribe() }

// Remove stops serving a stream that is gone: its interest, its place in the registry,
// whatever its subscribers keep of it (Dropped), and what waits in its intake, which is
// answered with stream not found.
func (r *Registry) Remove(s *Stream) {
	s.unsubscribe()
	r.mu.Lock()
	if r.streams[s.name] == s {
		delete(r.streams, s.name)
	}
	r.mu.Unlock()
	s.drop()
	r.closeIntake(s, server.NewJSStreamNotFoundError())
}

// ErrOverlap is the refusal OverlapCheck's check fails with.
var ErrOverlap = errors.New("subjects overlap with an existing stream")

// OverlapCheck is the subject-overlap check as PostgreSQL decides it: run in the
// transaction that stores a stream, on every other stream stored, under a lock that
// serialises stream creation across replicas, so two replicas cannot both create
// overlapping streams.
func OverlapCheck(subjects []string) pg.StreamCheck {
	return func(others []pg.StreamRow) error {
		for _, o := range others {
			var cfg server.StreamConfig
			if err := json.Unmarshal(o.Config, &cfg); err != nil {
				return fmt.Errorf("stored config of stream %q: %w", o.Name, err)
			}
			if subjectsCollide(cfg.Subjects, subjects) {
				return ErrOverlap
			}
		}
		return nil
	}
}

// Overlapping reports the first served stream other than name whose subjects collide with
// subjects.
func (r *Registry) Overlapping(name string, subjects []string) *Stream {
	for _, s := range r.List() {
		if s.name == name {
			continue
		}
		if subjectsCollide(s.Config().Subjects, subjects) {
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
