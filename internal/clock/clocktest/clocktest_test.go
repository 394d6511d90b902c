package clocktest_test

import (
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

var _ clock.Clock = (*clocktest.Fake)(nil)

// fired returns the tick ch holds, if any, without waiting: a fake clock fires on Advance,
// not later.
func fired(ch <-chan time.Time) (time.Time, bool) {
	select {
	case at := <-ch:
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := clocktest.At(at).Now(); !got.Equal(at) {
		t.Fatalf("At(%v) stands at %v", at, got)
	}
	before := time.Now()
	got := clocktest.New().Now()
	if after := time.Now(); got.Before(before) || got.After(after) {
		t.Fatalf("New stands at %v, not between %v and %v", got, before, after)
	}
	c := clocktest.At(at)
	c.Advance(time.Minute)
	if got := c.Now(); !got.Equal(at.Add(time.Minute)) {
		t.Fatalf("a minute on from %v the clock stands at %v", at, got)
	}
}

// TestTimersAndTickers holds the fake to what the module relies on of time.Timer and
// time.Ticker.
func TestTimersAndTickers(t *testing.T) {
	t.Parallel()
	c := clocktest.New()
	start := c.Now()

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

func TestTimerDueIn(t *testing.T) {
	t.Parallel()
	c := clocktest.New()
	tk := c.NewTicker(time.Second)
	defer tk.Stop()
	if c.TimerDueIn(time.Second) {
		t.Fatal("a ticker counted as a timer")
	}
	tm := c.NewTimer(time.Second)
	if !c.TimerDueIn(time.Second) {
		t.Fatal("a timer armed for a second is not due in a second")
	}
	c.Advance(400 * time.Millisecond)
	if c.TimerDueIn(time.Second) || !c.TimerDueIn(600*time.Millisecond) {
		t.Fatal("a timer's due time did not follow the clock")
	}
	tm.Stop()
	if c.TimerDueIn(600 * time.Millisecond) {
		t.Fatal("a stopped timer is still due")
	}
}

func TestNonPositiveTickerPanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Fatal("NewTicker(0) did not panic")
		}
	}()
	clocktest.New().NewTicker(0)
}
