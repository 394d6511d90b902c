// Package sqlmove brings what applications published in SQL, with jetgres.publish or into
// jetgres.outbox, into their streams: the SQL mover. What it cannot store it records in
// jetgres.outbox_rejected, in the move's own transaction, with the reason.
//
// A commit that published notifies pg.StagedChannel, which wakes the mover, unless a mover
// is awake (pg.MoverAwake): an awake mover looks every 2 ms on its own, and lets go 100 ms
// after its last move, then keeps to the tick period until every transaction that may have
// committed without notifying has ended (pg.StagedSettled). Its timer is the fallback, at
// the tick period while there is work and backing off to Config.IdleMax while there is none.
// Each move takes an append lane permit, like a flush, and appends one snapshot-bounded batch of
// committed staged messages through the same append path, so that sequences, de-duplication
// and limits apply as to a NATS publish.
//
// A move may append to a stream while that stream's own flush is in flight: the state row's
// lock orders the two in PostgreSQL as it orders the flushes of several replicas, and the
// tail takes their rows in whichever order they are reported.
//
// It owns the move loop, the staging and outbox tables' rotation, the awake lock and its session, the
// connection that listens for commits, and the jetgres_sql_publish_* metrics. The streams
// are the bridge's: the mover reads them, and what it needs of them and of their append
// path it asks through Host.
//
// # Goroutines and locks
//
// Two goroutines, from Start until Stop: one listens for commits and wakes the other, which
// moves. The mover has no lock of its own beyond its warning throttles, which are leaves. It
// calls Host with none of them held, and holds an append permit only across the move's
// transaction, which plans inside it with Host.Batch, Host.Expectations and
// Host.NoInterest; it gives the permit back before it announces the commit.
package sqlmove

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// stagingRotatePeriod is how long a staging or outbox table takes rows before the mover
	// switches to the other one, which bounds how much staging holds: what a period brings, twice.
	stagingRotatePeriod = time.Second
	// stagingRotateEvery is how often the mover takes a step of the rotation at most: a
	// switch comes up to this late, and staging holds that much more.
	stagingRotateEvery = 100 * time.Millisecond
	// listenRetry is the pause before listening again after the connection failed.
	listenRetry = time.Second
	// awakePoll is how often an awake mover looks for committed messages, and so the
	// longest a message waits to be moved while commits do not notify; linger is how long
	// it stays awake after its last move. Awake, it costs one small query a poll; the
	// commits it spares a NOTIFY share their WAL flushes instead of taking turns.
	awakePoll = 2 * time.Millisecond
	linger    = 100 * time.Millisecond
)

// Store is what the mover asks of PostgreSQL; *pg.DB is one.
type Store interface {
	Listen(ctx context.Context, channel string, notify func()) error
	MoverAwake() *pg.MoverAwake
	StagedWaiting(ctx context.Context) (bool, error)
	StagedSettled(ctx context.Context, horizon string) (bool, error)
	MoveStaged(ctx context.Context, max int, planner pg.MovePlanner, ts int64) (taken int, results []pg.AppendResult, rtt time.Duration, err error)
	Resolve(ctx context.Context, e *pg.OutcomeUnknownError) (pg.Resolution, error)
	RotateStaging(ctx context.Context, period time.Duration) (string, error)
	RotateOutbox(ctx context.Context, period time.Duration) (string, error)
}

// Destination is what the mover reads of a stream.
type Destination interface {
	ID() int64
	Name() string
	// ConfigView is the stream's configuration now, for reading only.
	ConfigView() *server.StreamConfig
	// StoredSubject is the subject a message published to subject is stored under (the
	// stream's subject_transform).
	StoredSubject(subject string) string
}

// AppendPath is what the mover needs of the streams this process serves and of their append
// path: the bridge's, so that a moved message is checked, stored and announced as a NATS
// publish is. Batch, Expectations and NoInterest are called inside the move's transaction
// (pg.MovePlanner) and must not block.
type AppendPath[S Destination] interface {
	// Streams lists the streams served now.
	Streams() []S
	// Sync re-reads the streams from PostgreSQL, for staged messages that name a stream
	// Streams did not list: one another replica created a moment ago, or one deleted.
	Sync(ctx context.Context) error
	// Batch is the empty append batch of s, as the publish path starts one: its id,
	// duplicate window, chunk size and limits.
	Batch(s S) pg.AppendBatch
	// Expectations reads a message's Nats-Msg-Id and Nats-Expected-* headers into m as the
	// publish path does, or returns the JetStream error the publish path would answer with.
	Expectations(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError
	// NoInterest reports, for an interest stream, which of the subjects no consumer wants.
	NoInterest(s S, subjects []string) []bool
	// Commit announces a move's commit to s, as a flush's commit is announced.
	Commit(ctx context.Context, s S, r pg.AppendResult)
	// Forget tells whatever holds messages of s in memory to drop them: a move whose commit
	// got no answer, and could not be read back, may have stored messages in s that nobody
	// was told of.
	Forget(ctx context.Context, s S)
}

// Config configures a Mover. Every field is required but Logger, Clock and Registerer.
type Config[S Destination] struct {
	Store Store
	// Append is the lane of appends: a move takes one of its permits, as a flush does.
	Append *flow.Lane
	Host   AppendPath[S]
	// Logger receives the mover's warnings. Defaults to discarding them.
	Logger *slog.Logger
	// Clock tells the time and wakes the mover. Nil means the system clock.
	Clock clock.Clock
	// Registerer receives the mover's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// TickPeriod is how often the mover looks on its timer while there is work, or while a
	// commit may have been made unnotified.
	TickPeriod time.Duration
	// IdleMax is how far the timer's period backs off, doubling, while there is no work.
	IdleMax time.Duration
	// MaxMsgs caps the staged messages one move takes: an append flush's bound.
	MaxMsgs int
}

func (c *Config[S]) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("Config.Store is required"))
	}
	if c.Append == nil {
		errs = append(errs, errors.New("Config.Append is required"))
	}
	if c.Host == nil {
		errs = append(errs, errors.New("Config.Host is required"))
	}
	if c.TickPeriod <= 0 {
		errs = append(errs, fmt.Errorf("Config.TickPeriod must be positive, got %s", c.TickPeriod))
	}
	if c.IdleMax <= 0 {
		errs = append(errs, fmt.Errorf("Config.IdleMax must be positive, got %s", c.IdleMax))
	}
	if c.MaxMsgs <= 0 {
		errs = append(errs, fmt.Errorf("Config.MaxMsgs must be positive, got %d", c.MaxMsgs))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqlmove: %w", err)
	}
	return nil
}

// Mover moves committed staged messages into their streams.
type Mover[S Destination] struct {
	db      Store
	appends *flow.Lane
	host    AppendPath[S]
	log     *slog.Logger
	clock   clock.Clock
	tick    time.Duration
	idle    time.Duration
	max     int

	m    *moverMetrics
	wake chan struct{}
	run  startstop.Group

	warnMove, warnRefused, warnListen warnlog.Throttle
}

// New checks the configuration, registers the mover's metrics and returns the mover, not
// yet started.
func New[S Destination](cfg Config[S]) (*Mover[S], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Mover[S]{
		db: cfg.Store, appends: cfg.Append, host: cfg.Host, log: log, clock: clock.OrSystem(cfg.Clock),
		tick: cfg.TickPeriod, idle: cfg.IdleMax, max: cfg.MaxMsgs,
		m: newMetrics(cfg.Registerer), wake: make(chan struct{}, 1),
	}, nil
}

// Start starts the mover's goroutines, which run until Stop or until ctx ends. A mover
// starts once: a second Start fails, and so does a Start after Stop.
func (m *Mover[S]) Start(ctx context.Context) error {
	ctx, err := m.run.Start(ctx)
	if err != nil {
		return fmt.Errorf("sqlmove: start: %w", err)
	}
	m.run.Go(func() { m.listen(ctx) })
	m.run.Go(func() { m.loop(ctx) })
	return nil
}

// Stop stops the mover and returns once its goroutines have. A move in flight is cancelled;
// what it had not committed is moved by the next mover. Stop is safe to call twice and
// before Start.
func (m *Mover[S]) Stop() { m.run.Stop() }

// listen wakes the mover on every commit that published, for as long as ctx lasts.
func (m *Mover[S]) listen(ctx context.Context) {
	for {
		err := m.db.Listen(ctx, pg.StagedChannel, m.poke)
		if ctx.Err() != nil {
			return
		}
		m.warnListen.Warn(m.log, m.clock.Now(), "listening for SQL publishes failed; moving on the timer", "err", err)
		t := m.clock.NewTimer(listenRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// poke wakes the move loop without waiting: a wake-up already pending covers this one.
func (m *Mover[S]) poke() { wake.Poke(m.wake) }

func (m *Mover[S]) loop(ctx context.Context) {
	base := m.tick
	period := base
	t := m.clock.NewTimer(period)
	defer t.Stop()
	awake := m.db.MoverAwake()
	defer awake.Close()
	held := false // awake's lock: commits that publish do not notify
	var lastWork, lastRotate time.Time
	settle := "" // the horizon of the last release, until every transaction below it ended
	for {
		woken := false
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
			woken = true
			if !t.Stop() {
				select {
				case <-t.C():
				default:
				}
			}
		case <-t.C():
		}
		moved := false
		if settle != "" {
			// Asked before looking for work, so that what those transactions committed is
			// seen by the look that follows.
			if ok, err := m.db.StagedSettled(ctx, settle); err == nil && ok {
				settle = ""
			}
		}
		// Ask first, without a permit: a wake-up may find nothing ready (the one at start,
		// or a commit that an older open transaction holds back), and a mover that took a
		// append permit only to find that would hold back the publishes that need it.
		work, err := m.db.StagedWaiting(ctx)
		if err != nil && ctx.Err() == nil {
			m.warnMove.Warn(m.log, m.clock.Now(), "looking for SQL publishes failed", "err", err)
		}
		if work && !held {
			// Held from now on, commits stop notifying; one that read the lock free a
			// moment ago notifies all the same, which costs a wake-up and no more.
			if ok, err := awake.Hold(ctx); err == nil {
				held = ok
			} else if ctx.Err() == nil {
				m.warnMove.Warn(m.log, m.clock.Now(), "taking the SQL mover's awake lock failed", "err", err)
			}
		}
		for work && ctx.Err() == nil {
			n, err := m.moveOnce(ctx)
			moved = moved || n > 0
			if err != nil || n < m.max {
				break
			}
		}
		now := m.clock.Now()
		// Not every poll: a rotation step locks the progress row, which makes it a commit
		// with a WAL flush of its own, on the path of every message an awake mover moves.
		if now.Sub(lastRotate) >= stagingRotateEvery && ctx.Err() == nil {
			lastRotate = now
			if _, err := m.db.RotateStaging(ctx, stagingRotatePeriod); err != nil && ctx.Err() == nil {
				m.warnMove.Warn(m.log, m.clock.Now(), "rotating the staging tables failed", "err", err)
			}
			if _, err := m.db.RotateOutbox(ctx, stagingRotatePeriod); err != nil && ctx.Err() == nil {
				m.warnMove.Warn(m.log, m.clock.Now(), "rotating the outbox tables failed", "err", err)
			}
		}
		if moved {
			lastWork = now
		}
		if held && now.Sub(lastWork) >= linger && ctx.Err() == nil {
			h, err := awake.Release(ctx)
			held = false
			if err != nil {
				m.warnMove.Warn(m.log, m.clock.Now(), "letting the SQL mover's awake lock go failed", "err", err)
			}
			// Without a horizon, the idle back-off bounds how late an unnotified commit moves.
			settle = h
		}
		// Awake, nobody notifies: look often. A commit still running elsewhere may hold
		// staged rows back, and one that began before the release may commit unnotified:
		// keep looking at the base period while either may be about.
		switch {
		case held:
			period = min(awakePoll, base)
		case moved || woken || settle != "":
			period = base
		default:
			period = min(period*2, max(m.idle, base))
		}
		t.Reset(period)
	}
}
