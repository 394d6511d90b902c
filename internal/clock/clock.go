// Package clock owns the one notion of time that drives jetgres's behaviour: the Clock
// interface, with the Timer and Ticker it hands out, and the system clock that every
// deployment runs on. The fake that tests move by hand is in clocktest.
//
// Whatever waits for time to pass, or decides by how much time has passed, asks a Clock:
// ack waits and backoff, pull request expiry and idle heartbeats, pause_until,
// inactive_threshold, max_age and duplicate windows, the pacing of cursor writes, ticks and
// stream syncs, and the flow limiter's rtt_base window and permit waits. Its Now also stamps
// what is stored and sent: message times, and the times in acks' reply subjects and in info
// responses. Outside tests a Clock must be the system clock.
//
// Consumer lease renewal and ownership, whose expiry PostgreSQL judges by its own clock, a
// wait on another goroutine rather than on time (Stop's wait for the flush dispatcher), and
// the deadlines that bound a call to the database stay on the system clock.
package clock

import "time"

// Clock tells the time and wakes its caller when time has passed.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now, as time.NewTimer does.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that fires every d, as time.NewTicker does.
	NewTicker(d time.Duration) Ticker
}

// Timer is what the module uses of a *time.Timer. As with a *time.Timer since Go 1.23, no
// tick from before a Stop or Reset is received after it.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration) bool
	Stop() bool
}

// Ticker is what the module uses of a *time.Ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// System returns the system clock: time.Now, time.NewTimer and time.NewTicker.
func System() Clock { return system{} }

// OrSystem returns c, or the system clock when c is nil: configurations leave their Clock
// nil to mean the system clock.
func OrSystem(c Clock) Clock {
	if c == nil {
		return system{}
	}
	return c
}

type system struct{}

func (system) Now() time.Time                   { return time.Now() }
func (system) NewTimer(d time.Duration) Timer   { return systemTimer{time.NewTimer(d)} }
func (system) NewTicker(d time.Duration) Ticker { return systemTicker{time.NewTicker(d)} }

type systemTimer struct{ t *time.Timer }

func (s systemTimer) C() <-chan time.Time        { return s.t.C }
func (s systemTimer) Reset(d time.Duration) bool { return s.t.Reset(d) }
func (s systemTimer) Stop() bool                 { return s.t.Stop() }

type systemTicker struct{ t *time.Ticker }

func (s systemTicker) C() <-chan time.Time { return s.t.C }
func (s systemTicker) Stop()               { s.t.Stop() }
