package flow

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	valid := seedOptions(nil)
	if err := valid.Validate(); err != nil {
		t.Fatalf("push defaults: %v", err)
	}
	for _, tc := range []struct {
		field  string
		mutate func(*Options)
	}{
		{"Options.Min", func(o *Options) { o.Min = 0 }},
		{"Options.Max", func(o *Options) { o.Max = o.Min - 1 }},
		{"Options.Init", func(o *Options) { o.Init = o.Min - 1 }},
		{"Options.Init", func(o *Options) { o.Init = o.Max + 1 }},
		{"Options.Alpha", func(o *Options) { o.Alpha = -1 }},
		{"Options.Alpha", func(o *Options) { o.Alpha = math.NaN() }},
		{"Options.Alpha", func(o *Options) { o.Alpha = math.Inf(1) }},
		{"Options.Beta", func(o *Options) { o.Beta = o.Alpha }},
		{"Options.Beta", func(o *Options) { o.Beta = math.NaN() }},
		{"Options.Beta", func(o *Options) { o.Beta = math.Inf(1) }},
		{"Options.Min", func(o *Options) { *o = Options{} }},
	} {
		o := valid
		tc.mutate(&o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", o, err, tc.field)
		}
	}
}

func TestNewLaneRejectsInvalidOptions(t *testing.T) {
	o := seedOptions(nil)
	o.Max = 2
	_, err := NewLane("append", o)
	if err == nil || !strings.Contains(err.Error(), `"append"`) || !strings.Contains(err.Error(), "Options.Max") {
		t.Fatalf("NewLane error = %v, want one naming the lane and Options.Max", err)
	}
}

func TestNewLaneStartsAtInit(t *testing.T) {
	l := newTestLane(t, seedOptions(nil))
	if l.Name() != t.Name() {
		t.Fatalf("Name = %q, want %q", l.Name(), t.Name())
	}
	want := LaneStats{Limit: PopInitDefault, RTTBase: time.Nanosecond}
	if st := l.Stats(); st != want {
		t.Fatalf("Stats = %+v, want %+v", st, want)
	}
}

func TestNewFixedNeverMovesItsLimit(t *testing.T) {
	l := NewFixed("fixed", 20)
	for _, rtt := range []time.Duration{time.Millisecond, time.Millisecond, 30 * time.Second, time.Millisecond} {
		drivenSample(t, l, rtt)
		if got := l.Stats().Limit; got != 20 {
			t.Fatalf("Limit = %d after a %v sample, want 20", got, rtt)
		}
	}
	if got := l.Stats().RTTBase; got != time.Millisecond {
		t.Fatalf("RTTBase = %v, want 1ms: a fixed lane still records", got)
	}
}

func TestNewFixedPanicsBelowOne(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewFixed(0) did not panic")
		}
	}()
	NewFixed("fixed", 0)
}

func TestIdleLaneDoesNotRamp(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))
	for range 1000 {
		clock.Advance(10 * time.Millisecond)
		idleSample(t, l, time.Millisecond)
	}
	if got := l.Stats().Limit; got != PopInitDefault {
		t.Fatalf("Limit = %d after 1000 cheap completions one at a time, want %d", got, PopInitDefault)
	}
}

// The guard is in_flight >= limit − 1, in_flight counting the completing operation.
func TestLimitMovesOnlyWhenDriven(t *testing.T) {
	l := newTestLane(t, seedOptions(newFakeClock()))
	idleSample(t, l, time.Millisecond)

	ps := takeAll(t, l)
	for _, p := range ps[14:] {
		p.Abandon()
	}
	ps = ps[:14]
	ps[0].Release(time.Millisecond) // 14 in flight < 15
	if got := l.Stats().Limit; got != 16 {
		t.Fatalf("Limit = %d after a completion at 14 in flight, want 16", got)
	}
	p, _ := l.TryAcquire()
	q, _ := l.TryAcquire()
	ps = append(ps[1:], p, q)
	ps[0].Release(time.Millisecond) // 15 in flight >= 15
	if got, want := l.Stats().Limit, int(math.Ceil(16+math.Log(16))); got != want {
		t.Fatalf("Limit = %d after a completion at 15 in flight, want %d", got, want)
	}
	for _, p := range ps[1:] {
		p.Abandon()
	}
}

func TestGrowHandsNewPermitsToWaiters(t *testing.T) {
	l := newTestLane(t, Options{Init: 4, Min: 4, Max: 64, Alpha: 3, Beta: 6, Clock: newFakeClock()})
	idleSample(t, l, time.Millisecond)
	ps := takeAll(t, l)

	var waiters []<-chan acquireResult
	for i := range 3 {
		waiters = append(waiters, acquireAsync(context.Background(), l))
		waitWaiting(t, l, i+1)
	}
	ps[0].Release(time.Millisecond) // queue 0: limit 4 → 4 + ln 4, six permits
	st := l.Stats()
	if st.Limit != 6 || st.InFlight != 6 || st.Waiting != 0 {
		t.Fatalf("Stats = %+v, want Limit 6, InFlight 6, Waiting 0", st)
	}
	for _, w := range waiters {
		r := <-w
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.p.Abandon()
	}
	for _, p := range ps[1:] {
		p.Abandon()
	}
}

func TestShrinkDoesNotRevokePermitsInUse(t *testing.T) {
	l := newTestLane(t, seedOptions(newFakeClock()))
	idleSample(t, l, time.Millisecond)
	ps := takeAll(t, l)
	waiter := acquireAsync(context.Background(), l)
	waitWaiting(t, l, 1)

	ps[0].Release(30 * time.Second) // limit 16 → 16 − ln 16 ≈ 13.2, fourteen permits
	ps = ps[1:]
	st := l.Stats()
	if st.Limit != 14 || st.InFlight != 15 || st.Waiting != 1 {
		t.Fatalf("after the shrink Stats = %+v, want Limit 14, InFlight 15, Waiting 1", st)
	}
	// Every permit still held stays valid; the surplus retires as they come back.
	ps[0].Abandon()
	if st := l.Stats(); st.InFlight != 14 || st.Waiting != 1 {
		t.Fatalf("at 14 in flight Stats = %+v, want the waiter still waiting", st)
	}
	if _, ok := l.TryAcquire(); ok {
		t.Fatal("TryAcquire succeeded at in_flight == limit")
	}
	ps[1].Abandon()
	r := <-waiter
	if r.err != nil {
		t.Fatal(r.err)
	}
	if st := l.Stats(); st.InFlight != 14 || st.Waiting != 0 {
		t.Fatalf("after the waiter was served Stats = %+v, want InFlight 14, Waiting 0", st)
	}
	r.p.Abandon()
	for _, p := range ps[2:] {
		p.Abandon()
	}
	if st := l.Stats(); st.InFlight != 0 {
		t.Fatalf("InFlight = %d after every permit came back, want 0", st.InFlight)
	}
}

func TestTimeoutShrinksLane(t *testing.T) {
	l := newTestLane(t, seedOptions(newFakeClock()))
	idleSample(t, l, 2*time.Millisecond)
	drivenSample(t, l, 30*time.Second) // the statement timeout's elapsed time
	if got, want := l.Stats().Limit, int(math.Ceil(16-math.Log(16))); got != want {
		t.Fatalf("Limit = %d after a timed-out operation, want %d", got, want)
	}
}

func TestLimitClampedToMax(t *testing.T) {
	l := newTestLane(t, Options{Init: 4, Min: 4, Max: 10, Alpha: 3, Beta: 6, Clock: newFakeClock()})
	idleSample(t, l, time.Millisecond)
	for range 20 {
		drivenSample(t, l, time.Millisecond)
		if got := l.Stats().Limit; got > 10 {
			t.Fatalf("Limit = %d, above Max 10", got)
		}
	}
	if got := l.Stats().Limit; got != 10 {
		t.Fatalf("Limit = %d after sustained growth, want Max 10", got)
	}
}

func TestLimitClampedToMin(t *testing.T) {
	// A band low enough that a saturated lane keeps shrinking all the way down.
	l := newTestLane(t, Options{Init: 10, Min: 5, Max: 64, Alpha: 1, Beta: 2, Clock: newFakeClock()})
	idleSample(t, l, time.Millisecond)
	for range 20 {
		drivenSample(t, l, time.Second)
		if got := l.Stats().Limit; got < 5 {
			t.Fatalf("Limit = %d, below Min 5", got)
		}
	}
	if got := l.Stats().Limit; got != 5 {
		t.Fatalf("Limit = %d after sustained shrinking, want Min 5", got)
	}
}

func TestTryAcquireUnderContention(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lane    func(t *testing.T) *Lane
		ceiling int
	}{
		{"fixed", func(*testing.T) *Lane { return NewFixed("fixed", 5) }, 5},
		{"adaptive", func(t *testing.T) *Lane {
			return newTestLane(t, Options{Init: 8, Min: 4, Max: 12, Alpha: 3, Beta: 6, Clock: newFakeClock()})
		}, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.lane(t)
			var inFlight, peak atomic.Int64
			var granted, refused atomic.Uint64
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					for range 500 {
						p, ok := l.TryAcquire()
						if !ok {
							refused.Add(1)
							continue
						}
						granted.Add(1)
						n := inFlight.Add(1)
						for {
							m := peak.Load()
							if n <= m || peak.CompareAndSwap(m, n) {
								break
							}
						}
						inFlight.Add(-1)
						p.Release(time.Duration(1+rand.IntN(20)) * time.Millisecond)
					}
				})
			}
			wg.Wait()
			if got := peak.Load(); got > int64(tc.ceiling) {
				t.Fatalf("%d permits in use at once, ceiling %d", got, tc.ceiling)
			}
			st := l.Stats()
			if st.InFlight != 0 || st.Acquired != granted.Load() || st.TryFailed != refused.Load() {
				t.Fatalf("Stats = %+v, want InFlight 0, Acquired %d, TryFailed %d", st, granted.Load(), refused.Load())
			}
		})
	}
}

func TestAcquireWithDoneContextTakesNothing(t *testing.T) {
	l := NewFixed("fixed", 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if p, err := l.Acquire(ctx); !errors.Is(err, context.Canceled) || p != nil {
		t.Fatalf("Acquire(cancelled) = %v, %v, want nil, context.Canceled", p, err)
	}
	if st := l.Stats(); st.InFlight != 0 || st.Acquired != 0 {
		t.Fatalf("Stats = %+v, want nothing taken", st)
	}
}

func TestAcquireCancelledWhileWaitingLeaksNothing(t *testing.T) {
	l := NewFixed("fixed", 1)
	held, _ := l.TryAcquire()
	ctx, cancel := context.WithCancel(context.Background())
	waiter := acquireAsync(ctx, l)
	waitWaiting(t, l, 1)
	cancel()
	if r := <-waiter; !errors.Is(r.err, context.Canceled) || r.p != nil {
		t.Fatalf("Acquire = %v, %v, want nil, context.Canceled", r.p, r.err)
	}
	if st := l.Stats(); st.Waiting != 0 || st.InFlight != 1 {
		t.Fatalf("Stats = %+v, want Waiting 0, InFlight 1", st)
	}
	held.Abandon()
	if st := l.Stats(); st.InFlight != 0 {
		t.Fatalf("InFlight = %d, want 0: the permit went to a cancelled waiter", st.InFlight)
	}
	p, ok := l.TryAcquire()
	if !ok {
		t.Fatal("the lane's only permit was lost")
	}
	p.Abandon()
}

func TestAcquireDeadline(t *testing.T) {
	l := NewFixed("fixed", 1)
	held, _ := l.TryAcquire()
	defer held.Abandon()
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want context.DeadlineExceeded", err)
	}
}

func TestAcquireIsFIFO(t *testing.T) {
	l := NewFixed("fixed", 1)
	held, _ := l.TryAcquire()

	const n = 10
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			p.Abandon() // hands the permit to the next in line
		})
		waitWaiting(t, l, i+1)
	}
	held.Abandon()
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("waiters served in order %v, want arrival order", order)
		}
	}
}

func TestTryAcquireDoesNotOvertakeWaiter(t *testing.T) {
	l := NewFixed("fixed", 1)
	held, _ := l.TryAcquire()
	waiter := acquireAsync(context.Background(), l)
	waitWaiting(t, l, 1)
	held.Abandon()
	if p, ok := l.TryAcquire(); ok {
		p.Abandon()
		t.Fatal("TryAcquire took the permit a waiter was queued for")
	}
	r := <-waiter
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Abandon()
}

func TestReleaseIsIdempotent(t *testing.T) {
	l := newTestLane(t, seedOptions(newFakeClock()))
	a, _ := l.TryAcquire()
	b, _ := l.TryAcquire()
	a.Release(time.Millisecond)
	a.Release(time.Microsecond)
	a.Abandon()
	if st := l.Stats(); st.InFlight != 1 || st.RTTBase != time.Millisecond {
		t.Fatalf("Stats = %+v, want InFlight 1 and RTTBase 1ms: a second release must do nothing", st)
	}
	b.Abandon()
	b.Release(time.Microsecond)
	if st := l.Stats(); st.InFlight != 0 || st.RTTBase != time.Millisecond {
		t.Fatalf("Stats = %+v, want InFlight 0 and RTTBase 1ms: Abandon records nothing", st)
	}
}

func TestWaitTotalCountsGrantedWaits(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, Options{Init: 1, Min: 1, Max: 1, Alpha: 3, Beta: 6, Clock: clock})
	held, _ := l.TryAcquire()
	waiter := acquireAsync(context.Background(), l)
	waitWaiting(t, l, 1)
	clock.Advance(5 * time.Millisecond)
	held.Abandon()
	r := <-waiter
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.p.Abandon()
	if st := l.Stats(); st.WaitTotal != 5*time.Millisecond || st.Acquired != 2 {
		t.Fatalf("Stats = %+v, want WaitTotal 5ms, Acquired 2", st)
	}
}

func TestFailShrinksLaneWithoutRecordingRTT(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))
	idleSample(t, l, 2*time.Millisecond)
	// A lone failure counts although the lane is not driven: a refused connection is news
	// about the database however little else is in flight.
	p, ok := l.TryAcquire()
	if !ok {
		t.Fatal("lane is not idle")
	}
	clock.Advance(100 * time.Microsecond)
	p.Fail()
	st := l.Stats()
	if want := int(math.Ceil(16 - math.Log(16))); st.Limit != want {
		t.Fatalf("Limit = %d after a failure, want %d", st.Limit, want)
	}
	if st.RTTBase != 2*time.Millisecond {
		t.Fatalf("RTTBase = %v after a failure, want it to stay 2ms", st.RTTBase)
	}
	if st.Failed != 1 || st.InFlight != 0 {
		t.Fatalf("Stats = %+v, want Failed 1 and InFlight 0", st)
	}
	p.Fail() // a second call does nothing
	p.Release(time.Second)
	if st := l.Stats(); st.Failed != 1 || st.Limit != int(math.Ceil(16-math.Log(16))) {
		t.Fatalf("Stats = %+v after giving the permit back twice more", st)
	}
}

func TestFailStepsOncePerChange(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))
	ps := takeAll(t, l)
	clock.Advance(time.Millisecond)
	// Every operation in flight fails at once, as when the database goes away: they all
	// started under the old limit, so the limit steps down once.
	for _, p := range ps {
		p.Fail()
	}
	if got, want := l.Stats().Limit, int(math.Ceil(16-math.Log(16))); got != want {
		t.Fatalf("Limit = %d after %d failures that began together, want %d", got, len(ps), want)
	}
}

func TestFailFallsToMinAndGrowsBack(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))
	idleSample(t, l, 2*time.Millisecond)
	// The database is unreachable: each retry fails at once.
	for range 50 {
		p, ok := l.TryAcquire()
		if !ok {
			t.Fatal("no permit free")
		}
		clock.Advance(100 * time.Microsecond)
		p.Fail()
	}
	if got := l.Stats().Limit; got != PopMinDefault {
		t.Fatalf("Limit = %d while the database is unreachable, want the minimum %d", got, PopMinDefault)
	}
	// It answers again as fast as before: the base was not disturbed, so the lane grows.
	for range 20 {
		drivenSample(t, l, 2*time.Millisecond)
	}
	if got := l.Stats().Limit; got <= PopInitDefault {
		t.Fatalf("Limit = %d after the database recovered, want it above the initial %d", got, PopInitDefault)
	}
}
