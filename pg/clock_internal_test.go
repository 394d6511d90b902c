package pg

import (
	"testing"
	"time"
)

// The offset moves only as far as a round trip proves it wrong: a slow round trip with a
// clock that agrees with PostgreSQL's leaves it at zero, a clock minutes off moves it to
// within the round trip of the truth, and a later fast round trip narrows it further.
func TestClockOffsetMovesOnlyAsFarAsProven(t *testing.T) {
	var c clockOffset
	t0 := time.Unix(1_000_000, 0)
	// PostgreSQL read its clock 9 ms into a 10 ms round trip on an agreeing clock.
	if off := c.record(t0, t0.Add(10*time.Millisecond), t0.Add(9*time.Millisecond)); off != 0 {
		t.Fatalf("a slow round trip on an agreeing clock moved the offset to %v", off)
	}
	// The replica's clock is 5 minutes behind: PostgreSQL reads t0+5m+4ms in a 10 ms trip.
	off := c.record(t0, t0.Add(10*time.Millisecond), t0.Add(5*time.Minute+4*time.Millisecond))
	if want := 5*time.Minute - 6*time.Millisecond; off != want {
		t.Fatalf("offset %v, want the nearest the round trip allows, %v", off, want)
	}
	// A 1 ms round trip proves the offset within [5m-0.5ms, 5m+0.5ms].
	off = c.record(t0, t0.Add(time.Millisecond), t0.Add(5*time.Minute+500*time.Microsecond))
	if want := 5*time.Minute - 500*time.Microsecond; off != want {
		t.Fatalf("offset %v after a fast round trip, want %v", off, want)
	}
	if got := time.Duration(c.ns.Load()); !c.known.Load() || got != off {
		t.Fatalf("stored offset %v (known %v), want %v", got, c.known.Load(), off)
	}
}
