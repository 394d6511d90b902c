// Package clocktest owns the fake clock.Clock that tests move by hand, so that what time
// drives (ack waits, heartbeats, thresholds, windows, leases) is exercised without waiting
// for it.
package clocktest

import (
	"sync"
	"time"

	"github.com/jetgres/jetgres/internal/clock"
)

// Fake stands still until a test advances it. Advancing it fires, at once, every timer and
// ticker whose time has come; the goroutines that wait on them react in their own time, so a
// test waits for the effect it expects rather than for the clock. It is safe for concurrent
// use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	pending map[*timer]struct{} // timers and tickers armed and not yet fired or stopped
}

// New returns a clock standing at the real time, so that what code under test stamps with
// it (message times, info times) looks like what it stamps in production.
func New() *Fake { return At(time.Now()) }

// At returns a clock standing at t, for tests that compare times they can write down.
func At(t time.Time) *Fake {
	return &Fake{now: t, pending: make(map[*timer]struct{})}
}

// Now returns the time the clock stands at.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d and fires what falls due.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

// NewTimer returns a timer that fires once the clock has moved on by d.
func (c *Fake) NewTimer(d time.Duration) clock.Timer { return c.arm(d, 0) }

// NewTicker returns a ticker that fires each time the clock passes another d. It panics if d
// is not positive, as time.NewTicker does.
func (c *Fake) NewTicker(d time.Duration) clock.Ticker {
	if d <= 0 {
		panic("clocktest: non-positive ticker period")
	}
	return ticker{c.arm(d, d)}
}

// TimerDueIn reports whether a timer (not a ticker) is armed to fire d from now: a test that
// knows the one wait lasting d can tell that the goroutine it watches has started waiting.
func (c *Fake) TimerDueIn(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.pending {
		if t.period == 0 && t.at.Equal(c.now.Add(d)) {
			return true
		}
	}
	return false
}

func (c *Fake) arm(d, period time.Duration) *timer {
	t := &timer{c: c, ch: make(chan time.Time, 1), period: period}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.at = c.now.Add(d)
	c.pending[t] = struct{}{}
	c.fireLocked()
	return t
}

// fireLocked sends the current time to every timer due. A ticker whose receiver is behind
// drops the tick, as a time.Ticker does, and moves on to its next period after now.
func (c *Fake) fireLocked() {
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

// timer is a Fake's timer or, with a period, its ticker. Stop and Reset empty its channel,
// so that no tick from before them is received after, as with time.Timer.
type timer struct {
	c      *Fake
	ch     chan time.Time
	period time.Duration
	at     time.Time // guarded by c.mu
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	active := t.stopLocked()
	t.at = t.c.now.Add(d)
	t.c.pending[t] = struct{}{}
	t.c.fireLocked()
	return active
}

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.stopLocked()
}

// stopLocked disarms t and reports whether it was armed or held a tick not yet received.
func (t *timer) stopLocked() bool {
	_, armed := t.c.pending[t]
	delete(t.c.pending, t)
	select {
	case <-t.ch:
		return true
	default:
		return armed
	}
}

type ticker struct{ *timer }

func (t ticker) Stop() { t.timer.Stop() }
