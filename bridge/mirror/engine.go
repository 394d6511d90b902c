package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// HealthHeartbeat is the idle heartbeat of the origin's consumer, nats-server's
	// sourceHealthHB.
	HealthHeartbeat = time.Second
	// HealthInterval is how long an origin may be silent before its consumer is created
	// again, and the consumer's inactive threshold: nats-server's sourceHealthCheckInterval.
	HealthInterval = 10 * time.Second
	// createTimeout bounds the wait for the origin's answer to a consumer create.
	createTimeout = 30 * time.Second
	// retryThreshold is the least time between two consumer creates for one origin, and
	// retryBackOff and retryMaximum its back-off after failures, as nats-server's.
	retryThreshold = 2 * time.Second
	retryBackOff   = 5 * time.Second
	retryMaximum   = 2 * time.Minute
	// FencePerLease: a copy stops when its lock session was last confirmed longer ago than
	// the lease divided by it, as the consumers' ownership fences.
	FencePerLease = 5
	// looksPerLease is how often per lease the engine confirms its session and looks for
	// streams to copy into.
	looksPerLease = 20
)

// Store is what the engine asks of PostgreSQL; *pg.DB is one.
type Store interface {
	OpenCopyLocks(ctx context.Context, clk clock.Clock, keepalive, timeout time.Duration) (*pg.Ownership, error)
	State(ctx context.Context, id int64) (pg.StreamState, error)
	RestoreBatch(ctx context.Context, p pg.RestoreParams) (pg.RestoreResult, error)
	Append(ctx context.Context, batches []pg.AppendBatch, ts int64) ([]pg.AppendResult, time.Duration, error)
	ReadFiltered(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, time.Duration, error)
}

// Link is the engine's own link to the NATS server; *leaf.Conn is one. The server hands
// a leafnode's message to a queue group only when the message names it: what the engine
// sends names the groups the server announced for its subject, the API's among them.
type Link interface {
	Subscribe(subject, queue string, h leaf.Handler) (*leaf.Subscription, error)
	HasInterest(subject string) bool
	QueueGroups(subject string, dst []string) []string
	PublishQueues(subject, reply string, queues []string, hdr, data []byte) error
}

// Host is what the engine asks of the bridge: the streams, and the streams' announcements
// of what the engine stored.
type Host interface {
	Streams() []*stream.Stream
	// Copied announces what a mirror's store added after the stream's last sequence (r.Prev),
	// msgs in sequence order, as a commit is announced, and applies the stream's limits to
	// it. msgs are the host's to keep.
	Copied(ctx context.Context, s *stream.Stream, r pg.RestoreResult, msgs []pg.Message)
	// Restored tells s that messages were stored that its readers could not have been told
	// of (a mirror's, by another replica, or sequences skipped), and that first and last
	// are its sequences now.
	Restored(ctx context.Context, s *stream.Stream, first, last uint64)
	// Batch is the append batch of s, with its limits and duplicate window; Commit
	// announces what an append of it stored.
	Batch(s *stream.Stream) pg.AppendBatch
	Commit(ctx context.Context, s *stream.Stream, r pg.AppendResult)
}

// Config configures an Engine. Store, Link and Host are required.
type Config struct {
	Store  Store
	Link   Link
	Host   Host
	Clock  clock.Clock
	Logger *slog.Logger
	// Lease is how long PostgreSQL lets the lock session be silent before it frees its
	// locks; the engine fences within a fifth of it.
	Lease time.Duration
	// Domain is this deployment's JetStream domain, named in the metadata of the
	// consumers the engine creates, as nats-server names its own.
	Domain string
}

// Engine copies into the streams with a mirror or sources whose copy lock it holds.
type Engine struct {
	cfg Config
	log *slog.Logger
	clk clock.Clock
	bg  startstop.Group
	ctx context.Context

	kick     chan struct{}
	warnLock warnlog.Throttle

	// own is the lock session, nil until the loop opens it, and held the streams whose
	// copy lock it holds; only the loop touches them.
	own  *pg.Ownership
	held map[int64]bool

	mu     sync.Mutex // guards copies
	copies map[int64]*streamCopy
}

// New builds an Engine; Start starts it.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || cfg.Link == nil || cfg.Host == nil {
		return nil, errors.New("mirror: Config.Store, Link and Host are required")
	}
	if cfg.Lease <= 0 {
		return nil, fmt.Errorf("mirror: Config.Lease must be positive, got %s", cfg.Lease)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Engine{cfg: cfg, log: log, clk: clock.OrSystem(cfg.Clock), kick: make(chan struct{}, 1), copies: make(map[int64]*streamCopy), held: make(map[int64]bool)}, nil
}

// Start starts the loop that takes streams over; ctx is the engine's life.
func (e *Engine) Start(ctx context.Context) error {
	bctx, err := e.bg.Start(ctx)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	e.ctx = bctx
	e.bg.Go(e.run)
	return nil
}

// Stop stops every copy and the loop, and closes the lock session.
func (e *Engine) Stop() {
	e.bg.Stop()
	e.stopAll()
	if e.own != nil {
		e.own.Close()
	}
}

// Kick makes the loop look at the streams at once: one may have been created, changed or
// deleted.
func (e *Engine) Kick() { wake.Poke(e.kick) }

func (e *Engine) run() {
	t := e.clk.NewTicker(e.cfg.Lease / looksPerLease)
	defer t.Stop()
	for {
		e.look()
		select {
		case <-e.ctx.Done():
			return
		case <-t.C():
		case <-e.kick:
		}
	}
}

// look confirms the lock session, fencing when it cannot, stops the copies whose stream no
// longer wants them, and takes the copy locks of the streams nobody copies into.
func (e *Engine) look() {
	ctx := e.ctx
	if e.own == nil {
		if !e.wanted() {
			return
		}
		own, err := e.cfg.Store.OpenCopyLocks(ctx, e.clk, e.cfg.Lease, e.cfg.Lease/10)
		if err != nil {
			e.warnLock.Warn(e.log, e.clk.Now(), "opening the session of the copy locks failed", "err", err)
			return
		}
		e.own = own
	}
	if !e.own.Connected() {
		e.lost()
		if err := e.own.Reconnect(ctx); err != nil {
			e.warnLock.Warn(e.log, e.clk.Now(), "reconnecting the session of the copy locks failed", "err", err)
			return
		}
	}
	if last := e.own.Confirmed(); last.IsZero() || e.clk.Now().Sub(last) > e.cfg.Lease/FencePerLease {
		// The locks may still be held, and are taken as held: the copies start again
		// once the session is confirmed, without locking twice.
		e.stopAll()
	}
	if err := e.own.Confirm(ctx); err != nil {
		e.lost()
		return
	}
	streams := e.cfg.Host.Streams()
	want := make(map[int64]*stream.Stream, len(streams))
	for _, s := range streams {
		if cfg := s.ConfigView(); cfg.Mirror != nil || len(cfg.Sources) > 0 {
			want[s.ID()] = s
		}
	}
	e.mu.Lock()
	var stop []*streamCopy
	for id, c := range e.copies {
		s, ok := want[id]
		if !ok || s != c.s || copyKey(s.ConfigView()) != c.key {
			stop = append(stop, c)
			delete(e.copies, id)
		}
	}
	e.mu.Unlock()
	for _, c := range stop {
		c.stop()
		keep := make(map[string]bool)
		if s, ok := want[c.s.ID()]; ok {
			for _, o := range newStreamCopy(e, s).origins {
				keep[o.iname] = true
			}
		}
		c.retire(keep)
	}
	for id := range e.held {
		if _, ok := want[id]; ok {
			continue
		}
		if err := e.own.UnlockCopy(ctx, id); err != nil {
			e.lost()
			return
		}
		delete(e.held, id)
	}
	for id, s := range want {
		e.mu.Lock()
		_, running := e.copies[id]
		e.mu.Unlock()
		if running {
			continue
		}
		if !e.held[id] {
			ok, err := e.own.TryLockCopy(ctx, id)
			if err != nil {
				e.lost()
				return
			}
			if !ok {
				continue
			}
			e.held[id] = true
		}
		e.start(s)
	}
}

// lost stops every copy: the session is gone, and its locks with it.
func (e *Engine) lost() {
	e.stopAll()
	clear(e.held)
}

// wanted reports whether any stream has a mirror or sources: until one has, the engine
// opens no session.
func (e *Engine) wanted() bool {
	for _, s := range e.cfg.Host.Streams() {
		if cfg := s.ConfigView(); cfg.Mirror != nil || len(cfg.Sources) > 0 {
			return true
		}
	}
	return false
}

func (e *Engine) start(s *stream.Stream) {
	c := newStreamCopy(e, s)
	e.mu.Lock()
	e.copies[s.ID()] = c
	e.mu.Unlock()
	c.start(e.ctx)
	e.log.Info("copying into stream", "stream", s.Name(), "origins", len(c.origins))
}

// stopAll stops every copy: their locks can no longer be vouched for, or the engine stops.
func (e *Engine) stopAll() {
	e.mu.Lock()
	all := e.copies
	e.copies = make(map[int64]*streamCopy)
	e.mu.Unlock()
	for _, c := range all {
		c.stop()
	}
	if len(all) > 0 && e.ctx.Err() == nil {
		e.log.Warn("the session of the copy locks is lost or unconfirmed: stopped copying", "streams", len(all))
	}
}

// Copying reports whether this replica copies into the stream with that id now.
func (e *Engine) Copying(streamID int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.copies[streamID]
	return ok
}

// copyKey is what a copy depends on in a stream's configuration: a change of it starts the
// copy again.
func copyKey(cfg *server.StreamConfig) string {
	b, _ := json.Marshal(struct {
		M *server.StreamSource   `json:"m"`
		S []*server.StreamSource `json:"s"`
	}{cfg.Mirror, cfg.Sources})
	return string(b)
}

// send publishes through the link to whoever listens on subject, queue groups included.
func (e *Engine) send(subject, reply string, hdr, data []byte) error {
	return e.cfg.Link.PublishQueues(subject, reply, e.cfg.Link.QueueGroups(subject, nil), hdr, data)
}
