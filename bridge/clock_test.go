package bridge

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that stands still until a test advances it. Advancing it fires, at
// once, every timer and ticker whose time has come; the goroutines that wait on them react
// in their own time, so a test waits for the effect it expects (waitFor) rather than for
// the clock. It starts at the real time, so that what the bridge stamps with it (message
// times, info times) looks like what it stamps in production.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	pending map[*fakeTimer]struct{} // timers and tickers armed and not yet fired or stopped
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Now(), pending: make(map[*fakeTimer]struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d and fires what falls due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

func (c *fakeClock) NewTimer(d time.Duration) Timer { return c.arm(d, 0) }

func (c *fakeClock) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("fakeClock: non-positive ticker period")
	}
	return fakeTicker{c.arm(d, d)}
}

func (c *fakeClock) arm(d, period time.Duration) *fakeTimer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1), period: period}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.at = c.now.Add(d)
	c.pending[t] = struct{}{}
	c.fireLocked()
	return t
}

// fireLocked sends the current time to every timer due. A ticker whose receiver is behind
// drops the tick, as a time.Ticker does, and moves on to its next period after now.
func (c *fakeClock) fireLocked() {
	for t := range c.pending {
		if t.at.After(c.now) {
			continue
		}
		select {
		case t.ch <- c.now:
		default:
		}
		if t.period == 0 {
			delete(c.pending, t)
			continue
		}
		for !t.at.After(c.now) {
			t.at = t.at.Add(t.period)
		}
	}
}

// timerDueIn reports whether a timer (not a ticker) is armed to fire d from now: a test
// that knows the one wait lasting d can tell that its goroutine has started waiting.
func (c *fakeClock) timerDueIn(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.pending {
		if t.period == 0 && t.at.Equal(c.now.Add(d)) {
			return true
		}
	}
	return false
}

// fakeTimer is a fakeClock's timer or, with a period, its ticker. Stop and Reset empty its
// channel, so that no tick from before them is received after, as with time.Timer.
type fakeTimer struct {
	c      *fakeClock
	ch     chan time.Time
	period time.Duration
	at     time.Time // guarded by c.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	active := t.stopLocked()
	t.at = t.c.now.Add(d)
	t.c.pending[t] = struct{}{}
	t.c.fireLocked()
	return active
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.stopLocked()
}

type fakeTicker struct{ *fakeTimer }

func (t fakeTicker) Stop() { t.fakeTimer.Stop() }

// stopLocked disarms t and reports whether it was armed or held a tick not yet received.
func (t *fakeTimer) stopLocked() bool {
	_, armed := t.c.pending[t]
	delete(t.c.pending, t)
	select {
	case <-t.ch:
		return true
	default:
		return armed
	}
}

// TestFakeClock holds the fake to what the bridge relies on of time.Timer and time.Ticker.
func TestFakeClock(t *testing.T) {
	t.Parallel()
	c := newFakeClock()
	start := c.Now()
	fired := func(ch <-chan time.Time) (time.Time, bool) {
		select {
		case at := <-ch:
			return at, true
		default:
			return time.Time{}, false
		}
	}

	tm := c.NewTimer(time.Second)
	c.Advance(999 * time.Millisecond)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("timer fired early")
	}
	c.Advance(time.Millisecond)
	if at, ok := fired(tm.C()); !ok || !at.Equal(start.Add(time.Second)) {
		t.Fatalf("timer at its time: fired %v at %v", ok, at)
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired and received timer reported it armed")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it armed")
	}
	c.Advance(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a timer holding an unreceived tick reported nothing to stop")
	}
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a tick from before Stop was received after it")
	}
	tm.Reset(0)
	if _, ok := fired(tm.C()); !ok {
		t.Fatal("Reset(0) did not fire at once")
	}

	tk := c.NewTicker(time.Second)
	c.Advance(3500 * time.Millisecond)
	if _, ok := fired(tk.C()); !ok {
		t.Fatal("ticker did not tick")
	}
	if _, ok := fired(tk.C()); ok {
		t.Fatal("ticker held more than one tick for a slow receiver")
	}
	c.Advance(500 * time.Millisecond)
	if at, ok := fired(tk.C()); !ok || !at.Equal(start.Add(6*time.Second)) {
		t.Fatalf("ticker on its period: fired %v at %v", ok, at)
	}
	tk.Stop()
	c.Advance(time.Hour)
	if _, ok := fired(tk.C()); ok {
		t.Fatal("stopped ticker ticked")
	}
}
