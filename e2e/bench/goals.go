package bench

import "fmt"

// goals checks the run against the goals of issues #4, #5, #7, #15 and #27. A goal whose numbers are
// missing (its section did not run or failed) is left out rather than reported as missed.
func goals(rep *Report) []Goal {
	var gs []Goal
	pub := func(t string) float64 {
		for _, p := range rep.Publish {
			if p.Target == t {
				return p.MsgsPerSec
			}
		}
		return 0
	}
	if jg, js := pub(TargetJetgres), pub(TargetJetStream); jg > 0 && js > 0 {
		gs = append(gs, atLeast("async publish vs JetStream (default sync)", jg/js, 1.0))
	}
	if jg, js := pub(TargetJetgres), pub(TargetJetStreamSync); jg > 0 && js > 0 {
		gs = append(gs, atLeast("async publish vs JetStream sync_always", jg/js, 25))
	}
	var jgFetch, jsFetch float64
	for _, f := range rep.Fetch {
		switch f.Target {
		case TargetJetgres:
			jgFetch = f.MsgsPerSec
		case TargetJetStream:
			jsFetch = f.MsgsPerSec
		}
	}
	if jgFetch > 0 && jsFetch > 0 {
		gs = append(gs, atLeast("fetch + ack vs JetStream", jgFetch/jsFetch, 1.0))
	}
	for _, mode := range PushModes {
		var jg, js float64
		for _, p := range rep.Push {
			switch {
			case p.Mode != mode:
			case p.Target == TargetJetgres:
				jg = p.MsgsPerSec
			case p.Target == TargetJetStream:
				js = p.MsgsPerSec
			}
		}
		if jg > 0 && js > 0 {
			gs = append(gs, atLeast("push, "+mode+", vs JetStream", jg/js, 1.0))
		}
	}
	gs = append(gs, orderedGoals(rep)...)
	var jgSync, pgSync float64
	for _, s := range rep.Sync {
		switch s.Target {
		case TargetJetgres:
			jgSync = s.Latency.P50us
		case TargetPostgres:
			pgSync = s.Latency.P50us
		}
	}
	if jgSync > 0 && pgSync > 0 {
		gs = append(gs, atMost("lone publish p50 vs one INSERT; COMMIT round trip", jgSync/pgSync, 1.5, "×"))
	}
	for _, l := range rep.Latency {
		if l.Target == TargetJetgres && l.Rate == 1000 && l.EndToEnd.Count > 0 {
			gs = append(gs, atMost("end-to-end p50 at 1,000 msg/s", l.EndToEnd.P50us/1000, 2, " ms"))
		}
	}
	vegas, fixed := &Overload{}, &Overload{}
	for i := range rep.Overload {
		switch rep.Overload[i].Target {
		case TargetJetgres:
			vegas = &rep.Overload[i]
		case TargetJetgresFixed:
			fixed = &rep.Overload[i]
		}
	}
	// Overload is judged at the heaviest load of the sweep, at least 10× capacity: that is
	// where congestion collapse would show, and, with 1,000 publishers, the only level at
	// which a fixed lane of FixedConcurrency permits is actually full.
	heaviest := func(ov *Overload) (OverloadStep, bool) {
		if len(ov.Steps) == 0 || ov.Steps[len(ov.Steps)-1].Multiple < 10 {
			return OverloadStep{}, false
		}
		return ov.Steps[len(ov.Steps)-1], true
	}
	if top, ok := heaviest(vegas); ok && vegas.Peak > 0 {
		at := fmt.Sprintf("at %g× overload (%d publishers)", top.Multiple, top.Publishers)
		g := atLeast("throughput "+at+" vs peak", top.MsgsPerSec/vegas.Peak, 0.9)
		g.Want, g.Got = "≥ 90 %", fmt.Sprintf("%.0f %%", 100*top.MsgsPerSec/vegas.Peak)
		gs = append(gs, g)
		if ftop, ok := heaviest(fixed); ok && ftop.Publishers == top.Publishers {
			g := Goal{Name: fmt.Sprintf("p99 %s, Vegas vs fixed %d", at, FixedConcurrency),
				Want: "below the fixed run's",
				Got:  fmt.Sprintf("%.1f ms vs %.1f ms", top.Latency.P99us/1000, ftop.Latency.P99us/1000),
				Met:  top.Latency.P99us < ftop.Latency.P99us}
			if !g.Met {
				g.Gap = fmt.Sprintf("%.2f× the fixed run's", top.Latency.P99us/ftop.Latency.P99us)
			}
			gs = append(gs, g)
		}
	}
	return gs
}

func atLeast(name string, got, want float64) Goal {
	g := Goal{Name: name, Want: fmt.Sprintf("≥ %g×", want), Got: fmt.Sprintf("%.2f×", got), Met: got >= want}
	if !g.Met {
		g.Gap = fmt.Sprintf("%.0f %% short", 100*(1-got/want))
	}
	return g
}

func atMost(name string, got, want float64, unit string) Goal {
	g := Goal{Name: name, Want: fmt.Sprintf("≤ %g%s", want, unit), Got: fmt.Sprintf("%.2f%s", got, unit), Met: got <= want}
	if !g.Met {
		g.Gap = fmt.Sprintf("%.0f %% over", 100*(got/want-1))
	}
	return g
}

// orderedGoals are issue #27's: the ordered readers at 0.85× JetStream's rate, and the
// ordered push consumer at 0.95× jetgres's CPU floor as well.
func orderedGoals(rep *Report) []Goal {
	rate := func(target, mode string) float64 {
		for _, p := range rep.Push {
			if p.Target == target && p.Mode == mode {
				return p.MsgsPerSec
			}
		}
		return 0
	}
	var gs []Goal
	for _, mode := range append([]string{PushOrdered, PushOrderedJS}, OrderedReads...) {
		if jg, js := rate(TargetJetgres, mode), rate(TargetJetStream, mode); jg > 0 && js > 0 {
			gs = append(gs, atLeast("ordered reader, "+mode+", vs JetStream", jg/js, 0.85))
		}
	}
	if jg, floor := rate(TargetJetgres, PushOrdered), rate(TargetJetgres, PushCPUFloor); jg > 0 && floor > 0 {
		gs = append(gs, atLeast("push, ordered, vs CPU floor", jg/floor, 0.95))
	}
	return gs
}
