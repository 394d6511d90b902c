// Package flow decides how many hot-path operations may be at PostgreSQL at once.
//
// A connection pool is a poor admission controller: it will put every one of its connections to
// work even when PostgreSQL can usefully run only a fraction of them, and the surplus turns into
// lock contention and fatter round trips. So each hot-path operation first takes a Permit from a
// Lane, and only then a pooled connection. Appends, reads and cursor writes have a lane each, with separate state,
// because their round-trip distributions are unrelated.
//
// A lane is a resizable semaphore sized by a TCP Vegas style limiter. Every completion reports its
// database round trip (Permit.Release), the limiter estimates how many operations are queued at
// PostgreSQL as limit × (1 − rtt_base / rtt), and it moves the limit to keep that estimate between
// Alpha and Beta. A statement that timed out is released with its elapsed time too, so a database
// that has started failing slowly is offered less work. An operation the database did not answer
// at all (no connection, or a broken one) gives its permit back with Permit.Fail, which records no
// round trip but steps the limit down. A holder that never reached the database because it had
// nothing to do gives its permit back with Permit.Abandon, which records nothing.
//
// The pool stays the hard ceiling and the lane is the soft one that normally binds first.
// Background jobs take connections without a permit. flow exports no metrics itself: whoever
// publishes them reads Lane.Stats.
package flow

import (
	"fmt"
	"math"

	"github.com/jetgres/jetgres/internal/clock"
)

// Defaults for the append, pop and ack lanes.
//
// The append lane keeps PostgreSQL's queue short on purpose. What waits for an append permit is
// not lost work but fusion: the next transaction takes whatever waits in every stream, so a
// publish that waits in jetgres commits together with others, where one let through to
// PostgreSQL competes with them for its cores, its locks and its WAL flush, and commits
// alone. With 256 streams, synchronous publishers and the database on the same two cores,
// warmed up, a band of 1 to 2 queued published 8% more at 8 publishers, 7% more at 32 and
// 72% more at 256 than the seed's band of 3 to 6 with at least 4 in flight, measured in one
// run, with a transaction taking the ready streams of every stream. At two in flight the
// limit grows while a transaction takes less than twice the uncongested round trip and
// shrinks once it takes three times as long; a database with cores to spare still lets it
// climb, since its round trips do not grow with concurrency. The limit is a ceiling: the
// bridge starts an append transaction beside one in flight only once that one has run for a
// while (bridge.Config.FlushOverlapAfter), since two half-full transactions in flight stored
// less than one full one at every load measured. Its minimum is 2, not 1, so that one
// transaction hung on a row lock (another replica, an application's session) leaves a lane
// for every other stream. The pop and ack lanes keep the seed's band: a read or a cursor
// write has no bundle to join.
const (
	AppendInitDefault  = 2
	AppendMinDefault   = 2
	AppendMaxDefault   = 64
	AppendAlphaDefault = 1.0
	AppendBetaDefault  = 2.0

	PopInitDefault = 16
	PopMinDefault  = 4
	PopMaxDefault  = 64

	AckInitDefault = 16
	AckMinDefault  = 4
	AckMaxDefault  = 64

	// AlphaDefault and BetaDefault are the Vegas band of the pop and ack lanes.
	AlphaDefault = 3.0
	BetaDefault  = 6.0
)

// Options configure a Lane. The numeric fields are taken as given: a zero is invalid, not a
// request for a default, because each lane has defaults of its own and a lane should
// never run with a value nobody chose. Fill them from the exported defaults.
type Options struct {
	// Init is the limit the lane starts with, within [Min, Max].
	// AppendInitDefault, PopInitDefault or AckInitDefault.
	Init int
	// Min is the lowest the limit may fall; at least 1.
	// AppendMinDefault, PopMinDefault or AckMinDefault.
	Min int
	// Max is the highest the limit may rise; at least Min. It is a safety ceiling, not an
	// operating point. AppendMaxDefault, PopMaxDefault or AckMaxDefault.
	Max int
	// Alpha is the estimated queue depth at or below which the limit grows; finite and at least 0.
	// AppendAlphaDefault for the append lane, AlphaDefault for the others.
	Alpha float64
	// Beta is the estimated queue depth at or above which the limit shrinks; finite and greater
	// than Alpha. AppendBetaDefault for the append lane, BetaDefault for the others.
	Beta float64
	// Clock tells the lane the time: it places round trips in the one-second slots of the
	// rtt_base window and measures permit waits, so that tests can walk through the 60-second
	// window without waiting for it. Nil means the system clock, the only right one outside
	// tests.
	Clock clock.Clock
}

// Validate reports the first invalid field, naming it.
func (o Options) Validate() error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("flow: %w", err)
	}
	return nil
}

func (o Options) validate() error {
	switch {
	case o.Min < 1:
		return fmt.Errorf("Options.Min is %d, must be at least 1", o.Min)
	case o.Max < o.Min:
		return fmt.Errorf("Options.Max is %d, must be at least Options.Min (%d)", o.Max, o.Min)
	case o.Init < o.Min || o.Init > o.Max:
		return fmt.Errorf("Options.Init is %d, must be within Options.Min and Options.Max [%d, %d]", o.Init, o.Min, o.Max)
	case !(o.Alpha >= 0) || math.IsInf(o.Alpha, 1): // written so that NaN fails too
		return fmt.Errorf("Options.Alpha is %v, must be finite and at least 0", o.Alpha)
	case !(o.Beta > o.Alpha) || math.IsInf(o.Beta, 1):
		return fmt.Errorf("Options.Beta is %v, must be finite and greater than Options.Alpha (%v)", o.Beta, o.Alpha)
	}
	return nil
}
