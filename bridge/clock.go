package bridge

import "time"

// Clock tells the bridge the time and wakes it when time has passed. Ack waits and backoff,
// pull request expiry and idle heartbeats, pause_until, inactive_threshold, max_age and
// duplicate windows, and the pacing of cursor writes, ticks and stream syncs all run on it,
// so tests substitute a clock they advance by hand to exercise them without waiting.
//
// Its Now also stamps what the bridge stores and sends: message times, and the times in
// acks' reply subjects and in info responses. Outside tests it must be the system clock.
//
// Two things stay on the system clock whatever Clock is: consumer lease renewal, whose
// expiry PostgreSQL judges by its own clock, and Stop's wait for the flush dispatcher,
// which waits on another goroutine rather than on time.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now, as time.NewTimer does.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that fires every d, as time.NewTicker does.
	NewTicker(d time.Duration) Ticker
}

// Timer is what the bridge uses of a *time.Timer. As with a *time.Timer since Go 1.23, no
// tick from before a Stop or Reset is received after it.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration) bool
	Stop() bool
}

// Ticker is what the bridge uses of a *time.Ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// clockOrSystem is c, or the system clock when c is nil.
func clockOrSystem(c Clock) Clock {
	if c == nil {
		return systemClock{}
	}
	return c
}

type systemClock struct{}

func (systemClock) Now() time.Time                   { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer   { return systemTimer{time.NewTimer(d)} }
func (systemClock) NewTicker(d time.Duration) Ticker { return systemTicker{time.NewTicker(d)} }

type systemTimer struct{ t *time.Timer }

func (s systemTimer) C() <-chan time.Time        { return s.t.C }
func (s systemTimer) Reset(d time.Duration) bool { return s.t.Reset(d) }
func (s systemTimer) Stop() bool                 { return s.t.Stop() }

type systemTicker struct{ t *time.Ticker }

func (s systemTicker) C() <-chan time.Time { return s.t.C }
func (s systemTicker) Stop()               { s.t.Stop() }
