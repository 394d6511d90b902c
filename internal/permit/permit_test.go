package permit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// TestReturn checks what each outcome of a database call tells the append lane: round trips
// the database answered are recorded, calls it never answered step the limit down without
// touching rtt_base, and calls the caller gave up on record nothing.
func TestReturn(t *testing.T) {
	const base = time.Millisecond
	// pg's errors are built from its exported values, not its wording: a timeout wraps the
	// context's deadline as well, and Return must tell it from the caller's own.
	timeout := errors.Join(pg.ErrTimeout, context.DeadlineExceeded)
	unavailable := errors.Join(pg.ErrUnavailable, errors.New("write: broken pipe"))
	for _, tc := range []struct {
		name     string
		rtt      time.Duration
		err      error
		wantBase time.Duration // rtt_base afterwards
		failed   uint64
	}{
		{"success", 3 * time.Millisecond, nil, base, 0},
		{"cheaper success", 300 * time.Microsecond, nil, 300 * time.Microsecond, 0},
		{"statement timeout", 2 * time.Second, timeout, base, 0},
		{"server error", 200 * time.Microsecond, errors.New("ERROR: division by zero (SQLSTATE 22012)"), 200 * time.Microsecond, 0},
		{"no connection", 0, unavailable, base, 1},
		{"connection broke", 50 * time.Microsecond, unavailable, base, 1},
		{"no connection free within the timeout", 0, timeout, base, 1},
		{"caller gave up", 0, context.Canceled, base, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lane, err := flow.NewLane("append", flow.Options{Init: 16, Min: 4, Max: 64, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault})
			if err != nil {
				t.Fatal(err)
			}
			p, ok := lane.TryAcquire()
			if !ok {
				t.Fatal("no permit")
			}
			p.Release(base)
			p, _ = lane.TryAcquire()
			Return(p, tc.rtt, tc.err)
			st := lane.Stats()
			if st.RTTBase != tc.wantBase || st.Failed != tc.failed || st.InFlight != 0 {
				t.Errorf("after Return(%v, %v): rtt_base %v, failed %d, in flight %d; want rtt_base %v, failed %d, none in flight",
					tc.rtt, tc.err, st.RTTBase, st.Failed, st.InFlight, tc.wantBase, tc.failed)
			}
			if tc.failed > 0 && st.Limit >= 16 {
				t.Errorf("limit %d after a call the database did not answer, want it below 16", st.Limit)
			}
		})
	}
}
