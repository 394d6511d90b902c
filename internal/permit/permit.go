// Package permit owns how a flow lane's permit is given back after a PostgreSQL call: what
// the call's outcome tells the lane's limiter, for every engine that holds permits (the
// flushes, the SQL mover, consumer reads, ticks and cursor writes).
package permit

import (
	"context"
	"errors"
	"time"

	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// Return gives p back after a database call that took rtt and ended with err. A call the
// database answered, with a result, an error of its own or a statement timeout, is a round
// trip. A call that got no answer at all (no connection, one that broke, or no connection
// free within the timeout) measured nothing: recording its near-zero time would drag
// rtt_base down to a round trip no statement achieves, leaving every real one to read as
// congestion for a minute after the database is back; it steps the limit down instead. A
// call its caller gave up on says nothing about the database.
func Return(p *flow.Permit, rtt time.Duration, err error) {
	switch {
	case err == nil:
		p.Release(rtt)
	case errors.Is(err, pg.ErrTimeout):
		if rtt > 0 {
			p.Release(rtt)
		} else {
			p.Fail()
		}
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		p.Abandon()
	case errors.Is(err, pg.ErrUnavailable) || rtt == 0:
		p.Fail()
	default:
		p.Release(rtt)
	}
}
