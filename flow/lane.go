package flow

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetgres/jetgres/internal/clock"
)

// Lane admits operations of one family (append, pop or ack) to the database, at most as many at once
// as its limit allows. Create one with NewLane or NewFixed; it is safe for concurrent use.
type Lane struct {
	name  string
	clock clock.Clock
	sem   semaphore

	// mu serialises completions so that each one reads in_flight and moves the limit as one step.
	// Where both are held, mu is taken first.
	mu    sync.Mutex
	vegas vegas

	acquired  atomic.Uint64
	tryFailed atomic.Uint64
	failed    atomic.Uint64
	waitTotal atomic.Int64 // nanoseconds
}

// NewLane returns a lane whose limit starts at opts.Init and adapts within [opts.Min, opts.Max].
// An invalid opts is reported naming the lane and the field.
func NewLane(name string, opts Options) (*Lane, error) {
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("flow: lane %q: %w", name, err)
	}
	clk := clock.OrSystem(opts.Clock)
	l := &Lane{name: name, clock: clk, vegas: newVegas(opts, clk.Now())}
	l.sem.size = l.vegas.size()
	return l, nil
}

// NewFixed returns a lane held at n permits, for comparing the limiter with a fixed
// concurrency. It still records round trips, so LaneStats.RTTBase means the same as on an adaptive
// lane, but its limit never moves. It panics if n < 1.
func NewFixed(name string, n int) *Lane {
	l, err := NewLane(name, Options{Init: n, Min: n, Max: n, Alpha: AlphaDefault, Beta: BetaDefault})
	if err != nil {
		panic(err)
	}
	return l
}

// Name returns the name the lane was created with.
func (l *Lane) Name() string { return l.name }

// Acquire takes a permit, waiting behind earlier callers if none is free. If ctx is done first
// (or already), Acquire returns an error wrapping ctx.Err() and no permit is held.
func (l *Lane) Acquire(ctx context.Context) (*Permit, error) {
	start := l.clock.Now()
	if err := l.sem.acquire(ctx); err != nil {
		return nil, fmt.Errorf("flow: lane %q: acquire: %w", l.name, err)
	}
	now := l.clock.Now()
	l.waitTotal.Add(int64(now.Sub(start)))
	l.acquired.Add(1)
	return &Permit{lane: l, start: now}, nil
}

// TryAcquire takes a permit only if one is free and nobody is waiting for it; it never waits.
// A false result means the lane is contended, which is also what the append path reads as "not
// idle". A permit taken this way has the same lifecycle as one from Acquire.
func (l *Lane) TryAcquire() (*Permit, bool) {
	if !l.sem.tryAcquire() {
		l.tryFailed.Add(1)
		return nil, false
	}
	l.acquired.Add(1)
	return &Permit{lane: l, start: l.clock.Now()}, true
}

// LaneStats is a snapshot of a lane. Counters are cumulative since NewLane.
type LaneStats struct {
	// Limit is the number of permits the limiter allows now.
	Limit int
	// InFlight is the number of permits held. It exceeds Limit for a while after a shrink,
	// because permits in use are never revoked.
	InFlight int
	// RTTBase is the minimum round trip of the last 60 seconds, 1 ns if none was recorded.
	RTTBase time.Duration
	// Acquired counts permits granted, by Acquire and TryAcquire.
	Acquired uint64
	// TryFailed counts TryAcquire calls that found the lane contended.
	TryFailed uint64
	// Failed counts permits given back with Permit.Fail: operations the database did not
	// answer at all.
	Failed uint64
	// WaitTotal is the time Acquire callers spent waiting for the permits they were granted;
	// waits that ended in cancellation are not included.
	WaitTotal time.Duration
	// Waiting is the number of Acquire calls waiting now.
	Waiting int
}

// Stats returns a snapshot of the lane. Counters and gauges are read at marginally different
// instants, so under load they need not be mutually consistent.
func (l *Lane) Stats() LaneStats {
	now := l.clock.Now()
	l.mu.Lock()
	base := l.vegas.window.base(now)
	size, held, waiting := l.sem.state()
	l.mu.Unlock()
	return LaneStats{
		Limit:     size,
		InFlight:  held,
		RTTBase:   base,
		Acquired:  l.acquired.Load(),
		TryFailed: l.tryFailed.Load(),
		Failed:    l.failed.Load(),
		WaitTotal: time.Duration(l.waitTotal.Load()),
		Waiting:   waiting,
	}
}

// Permit is one unit of a lane's concurrency. Give it back exactly once, with Release or
// Abandon; later calls on the same permit do nothing.
type Permit struct {
	lane  *Lane
	start time.Time // when it was granted: when the operation could start
	done  atomic.Bool
}

// Release records rtt, the operation's database round trip, to the lane's limiter and then
// returns the permit. A statement that failed or timed out must be released with its elapsed
// time too: a very long round trip is what shrinks the lane when the database slows down.
//
// The round trip always counts towards rtt_base, but it moves the limit only if the lane is
// driven: in_flight >= limit − 1, where in_flight is the number of permits held with this one
// still among them. As the lane has ceil(limit) permits, that is "at most one permit idle".
func (p *Permit) Release(rtt time.Duration) {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	l := p.lane
	now := l.clock.Now()
	l.mu.Lock()
	// Still holding this permit, so in_flight counts the completing operation.
	_, held, _ := l.sem.state()
	l.vegas.observe(now, rtt, held)
	l.sem.resize(l.vegas.size())
	l.mu.Unlock()
	l.sem.release()
}

// Fail returns the permit after an operation that got no answer from the database at all: no
// connection could be had, or the connection broke under it. There is no round trip to record
// (the time such a failure takes says nothing about the database's queue, and a refused
// connection comes back far faster than any statement), but it is congestion at its worst, as a
// loss is to TCP: the limit steps down, by the step a shrink takes, whether or not the lane is
// driven. rtt_base is left alone. As with round trips, only an operation that started after the
// limit last moved carries news about it. So while the database is unreachable the lane falls to
// its minimum, and once the database answers again the limit grows back from there as round
// trips show room, instead of offering a database that is just back the concurrency it had.
func (p *Permit) Fail() {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	l := p.lane
	l.failed.Add(1)
	now := l.clock.Now()
	l.mu.Lock()
	l.vegas.fail(now, p.start)
	l.sem.resize(l.vegas.size())
	l.mu.Unlock()
	l.sem.release()
}

// Abandon returns the permit without recording a round trip, for a holder that never reached
// the database (there turned out to be nothing to do). Recording its near-zero time would drag
// rtt_base down to a round trip no query achieves.
func (p *Permit) Abandon() {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	p.lane.sem.release()
}
