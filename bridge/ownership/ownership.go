// Package ownership decides which replica serves each consumer. Its one mechanism is the
// advisory lock of a consumer, keyed by the consumer's id, that a replica's ownership
// session (pg.Ownership) holds while it serves the consumer; the consumer's row only
// records the holder. Its one loop (Keeper.Run) keeps the claim: ClaimsPerLease times per
// lease it confirms the session or, at once when kicked and DeletedChecksPerLease times per
// lease should a notification be lost, reads which of the consumers served here were
// deleted; and it takes over this replica's share of the consumers nobody serves.
//
// Fencing keeps two replicas from serving one consumer: a session that is gone, fails a
// statement, or was last confirmed longer ago than the lease divided by FencePerLease
// stops every consumer this replica serves at once, long before PostgreSQL frees a silent
// session's locks (a whole lease and its keepalive probes).
//
// A consumer request that reaches a replica not serving the consumer goes to the one that
// does through the Forwarder, sealed with the deployment's secret, and is answered there.
//
// A seal holds for ForwardMaxAge, either way, so that a captured request cannot be replayed
// later; it is timed on PostgreSQL's clock, not on the replicas' own. Replicas share no clock
// but PostgreSQL's, and each reads it anyway, ClaimsPerLease times per lease, to confirm its
// ownership session: the confirmation reads clock_timestamp(), which bounds the offset
// within the round trip (pg.DB.ClockOffset). Replicas whose clocks are minutes apart then agree on the time within milliseconds,
// and the window keeps its meaning, which widening it to cover any skew would lose. The
// window stays a minute, for requests in flight and for a replica whose last measurement is
// old (its session down: it fences then, and serves nothing). The other sound ways cost
// more: the receiver handing out nonces costs a round trip per forward, and remembering the
// seals seen needs state the replicas share. A refusal is loud: the refusing replica logs
// and counts it, naming the replica that sealed the request, answers the client, and tells
// that replica, which logs and counts it too (Forwarder); a clock more than
// ClockWarnOffset from PostgreSQL's is logged by the keeper and shown in /metrics.
//
// The keeper serves nothing itself: the consumer engine (bridge/consumer) takes the locks
// through it and tells it, through Config, how to serve a consumer it claimed and how to
// stop consumers. It has no mutex of its own; pg.Ownership's lock is taken with none of the
// engine's held, and a lock given back late goes from a goroutine of its own.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// LeaseDefault is the usual lease: how long PostgreSQL lets an ownership session be
	// silent before it probes it and frees its locks.
	LeaseDefault = 10 * time.Second
	// ClaimsPerLease is how many times per lease a replica confirms its ownership session
	// and looks for consumers nobody serves: with the default lease, every 250 ms, which
	// bounds the time a dead replica's consumers stay silent.
	ClaimsPerLease = 40
	// confirmsPerLease sets the timeout of every statement of the ownership session, a
	// tenth of the lease: one that runs past it breaks the session.
	confirmsPerLease = 10
	// DeletedChecksPerLease is how often per lease the ownership loop reads which of its
	// consumers were deleted, should the notification of a deletion be lost.
	DeletedChecksPerLease = 3
	// FencePerLease sets the fencing deadline, a fifth of the lease: a replica that has not
	// confirmed its session for that long stops serving every consumer, whatever else it is
	// waiting for. PostgreSQL gives a silent session's locks away only after a whole lease.
	FencePerLease = 5
	// ClockWarnOffset is how far this replica's clock may be from PostgreSQL's before the
	// keeper warns. Nothing breaks beyond it (seals and message times are taken on
	// PostgreSQL's clock), but a machine whose clock is that far off is not kept in time,
	// and the times it shows its users (the times in consumer info, say) are that far off.
	ClockWarnOffset = 5 * time.Second
)

// Store opens the ownership session; *pg.DB satisfies it.
type Store interface {
	OpenOwnership(ctx context.Context, clk clock.Clock, keepalive, timeout time.Duration) (*pg.Ownership, error)
}

// Config configures a Keeper. Every field is required but Logger and Registerer.
type Config struct {
	Store Store
	Clock clock.Clock
	// Logger receives the keeper's records. Defaults to discarding them.
	Logger *slog.Logger
	// Registerer receives the keeper's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// Lease is how long PostgreSQL lets the session be silent before it frees its locks.
	Lease time.Duration

	// Streams lists the streams whose consumers may be claimed.
	Streams func() []*stream.Stream
	// Serve serves the consumer called name on s, whose lock was just taken; when it
	// cannot, it gives the lock back (Release) and says why. A consumer that is gone is
	// pg.ErrNotFound, and one left unserved because the engine is stopping is nil.
	Serve func(ctx context.Context, s *stream.Stream, name string, id int64) error
	// StopDeleted stops serving the consumers whose rows are gone: those of these ids, not
	// one created again under the same name.
	StopDeleted func(gone []pg.Claim)
	// StopAll stops serving every consumer, as the fence does, and reports how many it
	// stopped.
	StopAll func() int
	// Go runs f off the loop, reporting false when it can no longer (the engine stops).
	Go func(f func()) bool
}

func (c *Config) validate() error {
	if c.Store == nil || c.Clock == nil || c.Streams == nil || c.Serve == nil || c.StopDeleted == nil || c.StopAll == nil || c.Go == nil {
		return errors.New("ownership: Config.Store, Clock, Streams, Serve, StopDeleted, StopAll and Go are required")
	}
	if c.Lease <= 0 {
		return fmt.Errorf("ownership: Config.Lease must be positive, got %s", c.Lease)
	}
	return nil
}

// Keeper holds this replica's ownership session and keeps its claims.
type Keeper struct {
	cfg Config
	log *slog.Logger
	// own is nil until Open, and then set for good.
	own  *pg.Ownership
	kick chan struct{}
	// The warnings of attempts that fail together while the database is away, thinned, and
	// the one of a clock far off PostgreSQL's.
	warnSession, warnUnserved, warnClock warnlog.Throttle

	fencings prometheus.Counter
	// overdueClaims counts consumers taken by looks that may go past this replica's share.
	overdueClaims prometheus.Counter
	// offset is the clock offset the loop last saw measured, in ns, for the gauge.
	offset atomic.Int64
	// leftSince is when ClaimFree first left free consumers it did not take, zero while
	// the last look left none. Only ClaimFree reads and writes it, at start and then on
	// the loop alone.
	leftSince time.Time
}

// New checks the configuration and builds a Keeper; Open opens its session.
func New(cfg Config) (*Keeper, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &Keeper{
		cfg:  cfg,
		log:  log,
		kick: make(chan struct{}, 1),
		fencings: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_fencings_total",
			Help: "Times this replica could not confirm its ownership session and stopped serving every consumer."}),
		overdueClaims: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_overdue_claims_total",
			Help: "Consumers this replica took after free ones had waited a fencing deadline, when it may take one beyond its share: another replica is slow to take its own."}),
	}
	offset := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_clock_offset_seconds",
		Help: "How far PostgreSQL's clock is ahead of this replica's (negative: behind), as the ownership session last measured it. " +
			"Forwarded requests and message times are taken on PostgreSQL's clock; beyond 5 s the replica warns in its log."},
		func() float64 { return time.Duration(k.offset.Load()).Seconds() })
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(k.fencings, k.overdueClaims, offset)
	}
	return k, nil
}

// Open opens the ownership session. It is a session of its own: PostgreSQL gives a replica
// that is cut off its keepalive probes only after a whole lease of silence.
func (k *Keeper) Open(ctx context.Context) error {
	own, err := k.cfg.Store.OpenOwnership(ctx, k.cfg.Clock, k.cfg.Lease, k.cfg.Lease/confirmsPerLease)
	if err != nil {
		return err
	}
	k.own = own
	return nil
}

// Opened reports whether Open succeeded: until then no lock can be taken.
func (k *Keeper) Opened() bool { return k.own != nil }

// Close closes the session, and every lock goes with it.
func (k *Keeper) Close() {
	if k.own != nil {
		k.own.Close()
	}
}

// Confirmed is when the session was last confirmed.
func (k *Keeper) Confirmed() time.Time { return k.own.Confirmed() }

// Kick makes the loop look at once: a consumer may have been deleted, or freed, elsewhere.
func (k *Keeper) Kick() { wake.Poke(k.kick) }

// TryLock takes a consumer's lock if no other session holds it, and returns its id, which
// Release takes. The session must be open.
func (k *Keeper) TryLock(ctx context.Context, key pg.ConsumerKey) (int64, bool, error) {
	return k.own.TryLock(ctx, key)
}

// LockNew takes the lock of a consumer about to be created, and returns its id. The
// session must be open.
func (k *Keeper) LockNew(ctx context.Context, key pg.ConsumerKey) (int64, error) {
	return k.own.LockNew(ctx, key)
}

// Release gives back one count of the lock of the consumer with that id, waiting at most a
// lease.
func (k *Keeper) Release(id int64) {
	if k.own == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Lease)
	defer cancel()
	_ = k.own.Unlock(ctx, id)
}

// ReleaseLater gives back one count of a consumer's lock from a goroutine of its own, off
// the caller's locks: the statement waits for the session.
func (k *Keeper) ReleaseLater(id int64) {
	if k.own == nil {
		return
	}
	go k.Release(id)
}

// Run keeps this replica's claim on the consumers it serves, ClaimsPerLease times per
// lease and whenever kicked, until ctx ends. It stops serving every consumer at once
// (fences) when the ownership session is gone, fails a statement, or was last confirmed
// longer ago than the fencing deadline; it stops those deleted by any replica; and it takes
// over this replica's share of those nobody serves. Everything it waits for is a statement
// on the ownership session, bounded by a tenth of the lease, whose failure fences, and the
// consumers it takes over are served off the loop: so it looks again well within the
// fencing deadline, however slow the database is, and no other loop is needed.
//
// Run returns the loop rather than running it: its period, and the first look for deleted
// consumers a period away, count from the call, not from whenever the goroutine that runs
// it gets going. The consumers served at that moment were just claimed from PostgreSQL.
func (k *Keeper) Run() func(context.Context) {
	clock, lease := k.cfg.Clock, k.cfg.Lease
	t := clock.NewTicker(lease / ClaimsPerLease)
	checked := clock.Now()
	return func(ctx context.Context) {
		defer t.Stop()
		k.run(ctx, t, checked)
	}
}

func (k *Keeper) run(ctx context.Context, t clock.Ticker, checked time.Time) {
	clock, lease := k.cfg.Clock, k.cfg.Lease
	for {
		check := false
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-k.kick:
			check = true
		}
		own := k.own
		if !own.Connected() {
			// The session is gone, and its locks with it, or soon.
			k.fence(pg.ErrOwnershipLost)
			if err := own.Reconnect(ctx); err != nil {
				if ctx.Err() == nil {
					k.warnSession.Warn(k.log, clock.Now(), "reconnecting the ownership session failed", "err", err)
				}
				continue
			}
		}
		now := clock.Now()
		if last := own.Confirmed(); last.IsZero() || now.Sub(last) > lease/FencePerLease {
			k.fence(errors.New("ownership session not confirmed within the fencing deadline"))
		}
		// A deletion elsewhere notifies and so kicks; the period is for a lost notification.
		var err error
		if check || now.Sub(checked) >= lease/DeletedChecksPerLease {
			checked = now
			var gone []pg.Claim
			if gone, err = own.Deleted(ctx); err == nil && len(gone) > 0 {
				k.cfg.StopDeleted(gone)
			}
		} else {
			err = own.Confirm(ctx)
		}
		if err != nil {
			if ctx.Err() == nil {
				k.fence(err)
			}
			continue
		}
		if off, ok := own.ClockOffset(); ok {
			k.offset.Store(int64(off))
			if off > ClockWarnOffset || off < -ClockWarnOffset {
				k.warnClock.Warn(k.log, now, "this replica's clock is far from PostgreSQL's: keep it in time (NTP)", "postgresql_ahead_by", off)
			}
		}
		if serve := k.ClaimFree(ctx); serve != nil && !k.cfg.Go(func() { serve(ctx) }) {
			serve(nil)
		}
	}
}

// fence stops serving every consumer: their locks can no longer be vouched for.
func (k *Keeper) fence(cause error) {
	if n := k.cfg.StopAll(); n > 0 {
		k.fencings.Inc()
		k.log.Warn("ownership session lost: stopping every consumer this replica serves", "consumers", n, "err", cause)
	}
}

// ClaimFree locks this replica's share of the consumers of known streams that no replica
// serves, and returns what serves them (Config.Serve, one by one), which the caller may run
// off its own goroutine. A nil ctx gives the locks back instead, for a caller that cannot
// serve them after all. It returns nil when it locked none.
func (k *Keeper) ClaimFree(ctx context.Context) func(context.Context) {
	streams := k.cfg.Streams()
	if len(streams) == 0 {
		return nil
	}
	byID := make(map[int64]*stream.Stream, len(streams))
	ids := make([]int64, 0, len(streams))
	for _, s := range streams {
		byID[s.ID()] = s
		ids = append(ids, s.ID())
	}
	now := k.cfg.Clock.Now()
	// At its share, this replica takes one more free consumer only once free ones have been
	// left for a fencing deadline: those a dead replica left go first to the replicas below
	// their share, and none stays free for good because a live replica does not look.
	overdue := !k.leftSince.IsZero() && now.Sub(k.leftSince) >= k.cfg.Lease/FencePerLease
	keys, left, err := k.own.ClaimFree(ctx, ids, overdue)
	if err != nil {
		if ctx.Err() == nil {
			k.warnUnserved.Warn(k.log, k.cfg.Clock.Now(), "looking for consumers nobody serves failed", "err", err)
		}
		return nil
	}
	switch {
	case left == 0:
		k.leftSince = time.Time{}
	case k.leftSince.IsZero():
		k.leftSince = now
	}
	if len(keys) == 0 {
		return nil
	}
	if overdue {
		k.overdueClaims.Add(float64(len(keys)))
	}
	return func(ctx context.Context) {
		for _, key := range keys {
			s := byID[key.StreamID]
			if ctx == nil {
				k.Release(key.ID)
				continue
			}
			if err := k.cfg.Serve(ctx, s, key.Name, key.ID); err != nil && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
				k.log.Warn("taking a consumer over failed", "stream", s.Name(), "consumer", key.Name, "err", err)
			}
		}
	}
}

// HoldScheduler reports whether this replica is the one that fires the message schedules
// of the stream streamID, taking that role if no replica has it (pg.Ownership's
// HoldScheduler). It is false until the keeper is open, and while the session is not
// confirmed within the fencing deadline, as consumers stop then.
func (k *Keeper) HoldScheduler(ctx context.Context, streamID int64) (bool, error) {
	if k.own == nil {
		return false, nil
	}
	if last := k.own.Confirmed(); last.IsZero() || k.cfg.Clock.Now().Sub(last) > k.cfg.Lease/FencePerLease {
		return false, nil
	}
	return k.own.HoldScheduler(ctx, streamID)
}

// ReleaseScheduler gives up the role HoldScheduler took for a stream that was deleted
// (pg.Ownership's ReleaseScheduler).
func (k *Keeper) ReleaseScheduler(ctx context.Context, streamID int64) error {
	if k.own == nil {
		return nil
	}
	return k.own.ReleaseScheduler(ctx, streamID)
}
