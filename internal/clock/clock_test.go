package clock_test

import (
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

func TestOrSystem(t *testing.T) {
	t.Parallel()
	if got := clock.OrSystem(nil); got != clock.System() {
		t.Fatalf("OrSystem(nil) is %T, want the system clock", got)
	}
	c := clocktest.New()
	if got := clock.OrSystem(c); got != c {
		t.Fatalf("OrSystem(c) is %T, want c", got)
	}
}

// TestSystem holds the system clock's timers and tickers to what time's do, which the
// module's loops rely on: a received tick leaves nothing to stop, and ticks keep coming.
func TestSystem(t *testing.T) {
	t.Parallel()
	c := clock.System()
	recv := func(ch <-chan time.Time) time.Time {
		t.Helper()
		select {
		case at := <-ch:
			return at
		case <-time.After(10 * time.Second):
			t.Fatal("no tick within 10s")
			return time.Time{}
		}
	}

	start := c.Now()
	tm := c.NewTimer(time.Millisecond)
	if at := recv(tm.C()); at.Sub(start) < time.Millisecond {
		t.Fatalf("timer fired %v after it was armed, before its millisecond", at.Sub(start))
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired and received timer reported it armed")
	}
	tm.Reset(time.Hour)
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reported nothing to stop")
	}

	tk := c.NewTicker(time.Millisecond)
	defer tk.Stop()
	if first, second := recv(tk.C()), recv(tk.C()); !second.After(first) {
		t.Fatalf("ticker's second tick at %v, not after its first at %v", second, first)
	}
}
