// Package ticker finds the commits other replicas made to the streams whose consumers this
// replica serves: it polls their high-water marks in one statement, raises each stream's
// tail, reads the range the tail is missing once for all of the stream's consumers, and
// wakes those that wait. Commits this replica made reach its consumers without a tick, so
// the period bounds only the latency of other replicas' commits. The consumer engine
// (bridge/consumer) says which streams to poll and how to read PostgreSQL behind the tail.
//
// # Locks
//
// It has none of its own. A tick calls PollerConfig.Streams, which takes the engine's
// locks, with nothing held, and the tails' (bridge/tailcache) one at a time.
package ticker

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// PeriodDefault is the ticker's polling period while consumers wait. Commits made by
	// this process reach waiting consumers at once, without a tick; the ticker only finds
	// commits made by other replicas, so its period bounds their end-to-end latency. 50 ms
	// keeps that near the time a client takes to notice, and costs one indexed statement per
	// tick for all streams together.
	PeriodDefault = 50 * time.Millisecond
	// IdleMaxDefault is how far the ticker backs off, doubling its period, while the
	// high-water marks it polls do not move.
	IdleMaxDefault = time.Second

	// readMax caps the messages of one shared range read; a larger gap is closed over
	// several ticks, or by the consumers themselves reading PostgreSQL.
	readMax = 4096
)

// TickStore is what the ticker asks of PostgreSQL itself; *pg.DB satisfies it.
type TickStore interface {
	HighWater(ctx context.Context, streamIDs []int64) (map[int64]uint64, error)
}

// TickedStream is a stream whose consumers this replica serves.
type TickedStream interface {
	ID() int64
	Name() string
	Tail() *tailcache.Tail
	// Committed tells the consumers of rows read into the tail, the range read covering
	// the sequences from from on: rows other replicas committed reach their pending counts
	// only here, and rows this replica committed were counted already and count once.
	Committed(msgs []pg.Message, from uint64)
	// WakeParked wakes the consumers waiting for commits.
	WakeParked()
}

// PollerConfig configures a Poller. Every field is required.
type PollerConfig struct {
	Store TickStore
	// Read reads messages behind the tail, as every such read goes (a pop lane permit
	// first).
	Read      func(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, error)
	Clock     clock.Clock
	Logger    *slog.Logger
	Period    time.Duration
	TailBytes int // a read fills at most half of a tail
	// Streams lists the streams that have consumers served.
	Streams func() []TickedStream
	// Ticks counts the polls and Reads the range reads.
	Ticks, Reads prometheus.Counter
}

// Poller polls for other replicas' commits.
type Poller struct {
	cfg  PollerConfig
	kick chan struct{}
	// Each warning has a throttle of its own, so that one cannot hide the other.
	warnTick, warnFill warnlog.Throttle
}

// New builds a Poller; Run makes it poll.
func New(cfg PollerConfig) *Poller {
	return &Poller{cfg: cfg, kick: make(chan struct{}, 1)}
}

// Kick brings the ticker back to its base period: a consumer just parked and wants to hear
// of commits made elsewhere promptly.
func (t *Poller) Kick() { wake.Poke(t.kick) }

// Run polls every Period while the high-water marks move, backing off to IdleMaxDefault
// while they do not, until ctx ends.
func (t *Poller) Run(ctx context.Context) {
	base := t.cfg.Period
	period := base
	timer := t.cfg.Clock.NewTimer(period)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
			if period == base {
				continue
			}
			period = base
			if !timer.Stop() {
				select {
				case <-timer.C():
				default:
				}
			}
			timer.Reset(period)
			continue
		case <-timer.C():
		}
		if t.tick(ctx) {
			period = base
		} else {
			period = min(period*2, max(IdleMaxDefault, base))
		}
		timer.Reset(period)
	}
}

// tick is one poll: one statement for every stream with consumers, then at most one range
// read per stream whose high-water mark moved, shared by all its consumers through the
// tail. It reports whether anything moved.
func (t *Poller) tick(ctx context.Context) bool {
	streams := t.cfg.Streams()
	if len(streams) == 0 {
		return false
	}
	ids := make([]int64, len(streams))
	for i, s := range streams {
		ids[i] = s.ID()
	}
	t.cfg.Ticks.Inc()
	hw, err := t.cfg.Store.HighWater(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			t.warnTick.Warn(t.cfg.Logger, t.cfg.Clock.Now(), "tick failed", "err", err)
		}
		return false
	}
	moved := false
	for _, s := range streams {
		if !s.Tail().Raise(hw[s.ID()]) {
			continue
		}
		moved = true
		t.fill(ctx, s)
		s.WakeParked()
	}
	return moved
}

// fill reads the range the tail is missing.
func (t *Poller) fill(ctx context.Context, s TickedStream) {
	from, upTo, ok := s.Tail().Missing()
	if !ok {
		return
	}
	msgs, through, err := t.cfg.Read(ctx, pg.ReadParams{StreamID: s.ID(), From: from, UpTo: upTo, MaxMsgs: readMax, MaxBytes: t.cfg.TailBytes / 2}, nil)
	if err != nil {
		if ctx.Err() == nil {
			t.warnFill.Warn(t.cfg.Logger, t.cfg.Clock.Now(), "tick range read failed", "stream", s.Name(), "err", err)
		}
		return
	}
	t.cfg.Reads.Inc()
	s.Tail().Add(msgs, from, through)
	if len(msgs) > 0 {
		s.Committed(msgs, from)
	}
}
