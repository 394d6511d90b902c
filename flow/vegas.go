package flow

import (
	"math"
	"time"
)

// baseWindow is how many one-second slots rtt_base is the minimum of.
const baseWindow = 60

// vegas is the limit controller of one lane. It is not safe for concurrent use; the lane
// serialises completions.
//
// The limit is a float so that fractional steps (ln of the limit) accumulate; the semaphore is
// sized to its ceiling (see size).
type vegas struct {
	limit       float64
	min, max    float64
	alpha, beta float64
	window      rttWindow
	// adjusted is when the limit last moved. Only an operation that started after that
	// carries news about the new limit (see observe).
	adjusted time.Time
}

func newVegas(o Options, now time.Time) vegas {
	return vegas{
		limit:  float64(o.Init),
		min:    float64(o.Min),
		max:    float64(o.Max),
		alpha:  o.Alpha,
		beta:   o.Beta,
		window: rttWindow{epoch: now},
	}
}

// observe takes one completion: its round trip and the number of permits held at that moment,
// the completing operation's own included.
//
// The sample always enters the rtt_base window, but the limit moves only while the lane is being
// driven, in_flight >= limit − 1: an idle lane sees short round trips that would otherwise ramp
// the limit up for no reason, leaving a large permit count in place just as load arrives. With the
// semaphore sized to ceil(limit), that guard means "at most one permit was idle".
//
// A non-positive rtt counts as 1 ns, so the estimate stays finite.
func (v *vegas) observe(now time.Time, rtt time.Duration, inFlight int) {
	rtt = max(rtt, time.Nanosecond)
	// Recorded before the estimate so that a cheaper operation lowers the base at once (and reads
	// as an empty queue itself), and so that base <= rtt and the queue is within [0, limit).
	v.window.record(now, rtt)
	if float64(inFlight) < v.limit-1 {
		return
	}
	// At most one adjustment per round trip, as TCP Vegas does: an operation that started
	// before the last change measured the old concurrency, and reacting to it again would
	// step the limit once per completion (limit × ln(limit) per round trip), overshooting
	// both ways. Measured with flow's benchmark: 0.86 of the best fixed concurrency's
	// throughput when adjusting on every completion, 1.0 with this rule.
	if now.Add(-rtt).Before(v.adjusted) {
		return
	}
	queue := v.limit * (1 - float64(v.window.base(now))/float64(rtt))
	step := math.Max(math.Log(v.limit), 1)
	old := v.limit
	switch {
	case queue <= v.alpha:
		v.limit += step
	case queue >= v.beta:
		v.limit -= step
	}
	v.limit = min(max(v.limit, v.min), v.max)
	if v.limit != old {
		v.adjusted = now
	}
}

// fail takes an operation, started at started, that the database did not answer: the limit
// steps down unless it already moved since the operation started. No round trip is recorded.
func (v *vegas) fail(now, started time.Time) {
	if started.Before(v.adjusted) {
		return
	}
	old := v.limit
	v.limit = max(v.limit-math.Max(math.Log(v.limit), 1), v.min)
	if v.limit != old {
		v.adjusted = now
	}
}

// size is the number of permits the limit allows. Rounding up keeps the in-flight guard in
// observe exactly "in_flight >= size − 1" and cannot leave the range: Min and Max are integers.
func (v *vegas) size() int {
	return int(math.Ceil(v.limit))
}

// rttWindow keeps the minimum round trip of each of the last baseWindow seconds.
//
// A running minimum would anchor rtt_base to a round trip that may have stopped occurring (a
// stream of cheap operations goes away and expensive ones remain); every real operation would
// then read as queueing and the limit would collapse. Expiring slots let the base rise again
// within a minute.
type rttWindow struct {
	epoch time.Time
	slots [baseWindow]rttSlot
}

type rttSlot struct {
	sec int64         // second since the epoch this slot last held
	min time.Duration // zero: never written
}

// second counts from the window's epoch rather than using wall-clock seconds, so a step of the
// wall clock cannot scramble the slots (time.Now readings carry a monotonic clock). A clock that
// runs back past the epoch stays in the epoch's second.
func (w *rttWindow) second(now time.Time) int64 {
	return max(int64(now.Sub(w.epoch)/time.Second), 0)
}

func (w *rttWindow) record(now time.Time, rtt time.Duration) {
	sec := w.second(now)
	s := &w.slots[sec%baseWindow]
	if s.sec != sec || s.min == 0 || rtt < s.min {
		s.sec, s.min = sec, rtt
	}
}

// base is rtt_base: the minimum over the slots of the last baseWindow seconds, or 1 ns if there
// are none, so that dividing by it is always defined.
func (w *rttWindow) base(now time.Time) time.Duration {
	sec := w.second(now)
	var base time.Duration
	for _, s := range w.slots {
		if s.min == 0 || sec-s.sec >= baseWindow {
			continue
		}
		if base == 0 || s.min < base {
			base = s.min
		}
	}
	if base == 0 {
		return time.Nanosecond
	}
	return base
}
