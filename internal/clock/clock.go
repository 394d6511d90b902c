// Package clock owns the one notion of time that drives jetgres's behaviour: the Clock
// interface, with the Timer and Ticker it hands out, and the system clock that every
// deployment runs on. The fake that tests move by hand is in clocktest.
//
// Everything in the bridge and its flow lanes that waits for time to pass, or decides by
// how much time has passed, asks a Clock: ack waits and backoff, pull request expiry and
// idle heartbeats, pause_until, inactive_threshold, max_age and duplicate windows, the
// pacing of cursor writes, ticks and stream syncs, the flow limiter's rtt_base window and
// permit waits, and consumer ownership. Its Now also stamps what is stored and sent:
// message times, and the times in acks' reply subjects and in info responses. What replicas
// compare with each other's (message times, the seals of forwarded requests) is moved onto
// PostgreSQL's clock, by the offset that package pg measures against this Clock.
//
// That consumer ownership follows the Clock means that a replica renews its leases, confirms
// the session holding their locks, and fences itself when the confirmations stop, at the
// times its Clock says. It does not mean that the Clock judges when a lease runs out:
// PostgreSQL does, by its own now(), a lease after the renewal it last stamped, and it frees
// a session's locks when the session ends. On the system clock the replica's side and
// PostgreSQL's agree, because renewal and fencing come at fractions of the lease. A clock
// that runs slower than real time, as a fake that nobody moves does, renews too rarely for
// PostgreSQL and fences too late to be safe: outside tests a Clock must be the system clock.
//
// A wait on another goroutine rather than on time (Stop's wait for the flush dispatcher),
// and the deadlines that bound a call to the database, stay on the system clock.
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
