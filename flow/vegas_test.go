package flow

import (
	"math"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

func TestRTTBaseIsOneNanosecondWithoutSamples(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))
	if got := l.Stats().RTTBase; got != time.Nanosecond {
		t.Fatalf("RTTBase of a new lane = %v, want 1ns", got)
	}

	idleSample(t, l, 3*time.Millisecond)
	clock.Advance(60 * time.Second)
	if got := l.Stats().RTTBase; got != time.Nanosecond {
		t.Fatalf("RTTBase 60s after the only sample = %v, want 1ns", got)
	}
}

func TestRTTBaseCheaperOperationLowersItAtOnce(t *testing.T) {
	l := newTestLane(t, seedOptions(newFakeClock()))

	idleSample(t, l, 10*time.Millisecond)
	if got := l.Stats().RTTBase; got != 10*time.Millisecond {
		t.Fatalf("RTTBase = %v, want 10ms", got)
	}
	idleSample(t, l, 2*time.Millisecond)
	if got := l.Stats().RTTBase; got != 2*time.Millisecond {
		t.Fatalf("RTTBase after a cheaper operation = %v, want 2ms", got)
	}
	idleSample(t, l, 20*time.Millisecond)
	if got := l.Stats().RTTBase; got != 2*time.Millisecond {
		t.Fatalf("RTTBase after a dearer operation = %v, want it to stay 2ms", got)
	}
}

func TestRTTBaseRisesOnceWindowRotatesPastCheapSample(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))

	idleSample(t, l, 2*time.Millisecond)
	for range 59 {
		clock.Advance(time.Second)
		idleSample(t, l, 10*time.Millisecond)
	}
	clock.Advance(999 * time.Millisecond)
	if got := l.Stats().RTTBase; got != 2*time.Millisecond {
		t.Fatalf("RTTBase 59.999s after the cheap sample = %v, want 2ms", got)
	}
	clock.Advance(time.Millisecond)
	if got := l.Stats().RTTBase; got != 10*time.Millisecond {
		t.Fatalf("RTTBase 60s after the cheap sample = %v, want 10ms", got)
	}
}

func TestRTTWindowSlotKeepsItsSecondsMinimum(t *testing.T) {
	start := newFakeClock().Now()
	w := rttWindow{epoch: start}
	w.record(start, 5*time.Millisecond)
	w.record(start.Add(300*time.Millisecond), 7*time.Millisecond)
	w.record(start.Add(600*time.Millisecond), 4*time.Millisecond)
	w.record(start.Add(900*time.Millisecond), 6*time.Millisecond)
	if got := w.base(start.Add(950 * time.Millisecond)); got != 4*time.Millisecond {
		t.Fatalf("base = %v, want 4ms", got)
	}
	// The slot is reused 60 s later: the old minimum must not survive into the new second.
	later := start.Add(60 * time.Second)
	w.record(later, 9*time.Millisecond)
	if got := w.base(later); got != 9*time.Millisecond {
		t.Fatalf("base after the slot was reused = %v, want 9ms", got)
	}
}

func TestVegasUpdateRule(t *testing.T) {
	now := newFakeClock().Now()
	base := 10 * time.Millisecond
	for _, tc := range []struct {
		name string
		rtt  time.Duration
		want float64
	}{
		// limit 16: queue = 16 × (1 − 10/rtt); step = ln 16.
		{"queue 0 grows", base, 16 + math.Log(16)},
		{"queue 3 (alpha) grows", 160 * time.Millisecond / 13, 16 + math.Log(16)},
		{"queue 4 holds", 40 * time.Millisecond / 3, 16},
		{"queue 6 (beta) shrinks", 16 * time.Millisecond, 16 - math.Log(16)},
		{"queue near limit shrinks", 30 * time.Second, 16 - math.Log(16)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newVegas(seedOptions(nil), now)
			v.window.record(now, base)
			v.observe(now, tc.rtt, 16)
			if math.Abs(v.limit-tc.want) > 1e-9 {
				t.Fatalf("limit = %v, want %v", v.limit, tc.want)
			}
		})
	}
}

func TestVegasStepIsAtLeastOne(t *testing.T) {
	now := newFakeClock().Now()
	v := newVegas(Options{Init: 2, Min: 1, Max: 10, Alpha: 3, Beta: 6}, now)
	v.observe(now, time.Millisecond, 2)
	if v.limit != 3 { // ln 2 < 1
		t.Fatalf("limit = %v, want 3", v.limit)
	}
}

func TestVegasSizeRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		limit float64
		want  int
	}{{4, 4}, {5.0001, 6}, {18.77, 19}, {64, 64}} {
		v := vegas{limit: tc.limit}
		if got := v.size(); got != tc.want {
			t.Errorf("size at limit %v = %d, want %d", tc.limit, got, tc.want)
		}
	}
}

func TestNonPositiveRTTCountsAsOneNanosecond(t *testing.T) {
	l := newTestLane(t, seedOptions(newFakeClock()))
	drivenSample(t, l, 0)
	drivenSample(t, l, -time.Second)
	st := l.Stats()
	if st.RTTBase != time.Nanosecond {
		t.Fatalf("RTTBase = %v, want 1ns", st.RTTBase)
	}
	if st.Limit <= PopInitDefault {
		t.Fatalf("Limit = %d, want growth from %d (queue 0)", st.Limit, PopInitDefault)
	}
}

// The reason the window expires: when cheap operations stop, the heavy ones left read as
// congestion and the limit collapses, but only until the cheap sample leaves the window.
func TestLaneRecoversAfterWorkloadShift(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))

	idleSample(t, l, time.Millisecond)
	for range 10 {
		drivenSample(t, l, 10*time.Millisecond)
	}
	collapsed := l.Stats().Limit
	if collapsed >= PopInitDefault {
		t.Fatalf("Limit = %d after heavy operations against a 1ms base, want below %d", collapsed, PopInitDefault)
	}

	for range 60 {
		clock.Advance(time.Second)
		drivenSample(t, l, 10*time.Millisecond)
	}
	st := l.Stats()
	if st.RTTBase != 10*time.Millisecond {
		t.Fatalf("RTTBase = %v, want 10ms once the cheap sample expired", st.RTTBase)
	}
	if st.Limit <= collapsed {
		t.Fatalf("Limit = %d, want it to recover above %d once the base rose", st.Limit, collapsed)
	}
}

// An operation that started before the limit last moved measured the old concurrency: it
// must not move the limit again, or the limit steps once per completion and overshoots.
func TestOneAdjustmentPerRoundTrip(t *testing.T) {
	clock := newFakeClock()
	l := newTestLane(t, seedOptions(clock))
	idleSample(t, l, time.Millisecond)
	ps := takeAll(t, l)
	clock.Advance(time.Millisecond)
	ps[0].Release(time.Millisecond) // queue 0: grows
	grown := l.Stats().Limit
	if grown <= PopInitDefault {
		t.Fatalf("Limit = %d, want growth from %d", grown, PopInitDefault)
	}
	// Fill the new permits, then complete the rest of the old round: no further change.
	ps = append(ps[1:], takeAll(t, l)...)
	for _, p := range ps[:len(ps)/2] {
		p.Release(time.Millisecond)
	}
	if got := l.Stats().Limit; got != grown {
		t.Fatalf("Limit = %d after completions that started before the change, want %d", got, grown)
	}
	for _, p := range ps[len(ps)/2:] {
		p.Abandon()
	}
	// One more round trip later it reacts again.
	drivenSample(t, l, time.Millisecond)
	if got := l.Stats().Limit; got <= grown {
		t.Fatalf("Limit = %d a round trip later, want growth from %d", got, grown)
	}
}

// The append lane's defaults keep PostgreSQL's queue short: round trips three times the
// uncongested one hold the limit at its minimum (the publishes wait in jetgres and fuse), while round
// trips that do not grow with concurrency, a database with cores to spare, let it climb.
func TestPushDefaultsHoldWhenRoundTripsDoubleAndGrowWhenTheyDoNot(t *testing.T) {
	push := func(clk *clocktest.Fake) Options {
		return Options{Init: AppendInitDefault, Min: AppendMinDefault, Max: AppendMaxDefault,
			Alpha: AppendAlphaDefault, Beta: AppendBetaDefault, Clock: clk}
	}
	l := newTestLane(t, push(newFakeClock()))
	idleSample(t, l, time.Millisecond)
	for range 20 {
		drivenSample(t, l, 3*time.Millisecond)
	}
	if got := l.Stats().Limit; got != AppendMinDefault {
		t.Errorf("Limit = %d with round trips three times the base, want the minimum %d", got, AppendMinDefault)
	}

	l = newTestLane(t, push(newFakeClock()))
	idleSample(t, l, time.Millisecond)
	for range 20 {
		drivenSample(t, l, time.Millisecond)
	}
	if got := l.Stats().Limit; got <= AppendInitDefault+10 {
		t.Errorf("Limit = %d with round trips at the base, want it well above the initial %d", got, AppendInitDefault)
	}
}
