package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/flow"
)

const (
	// overloadStreamsFull spreads the publishers over more streams than FixedConcurrency:
	// jetgres runs at most one transaction per stream at a time, so with fewer streams a lane
	// of 160 could never have 160 transactions in flight and the comparison would be moot.
	overloadStreamsFull  = 256
	overloadStreamsQuick = 16
	// calibrationPublishers is the concurrency whose throughput is taken as the capacity.
	calibrationPublishers = 64
	// overloadConns is how many client connections a sweep's publishers share.
	overloadConns = 16
)

// Load levels of the overload sweep, as multiples of capacity.
var (
	multiplesFull  = []float64{1, 2, 4, 6, 8, 10}
	multiplesQuick = []float64{1, 10}
)

func (r *runner) overloadStreams() int {
	if r.cfg.Quick {
		return overloadStreamsQuick
	}
	return overloadStreamsFull
}

// stepDuration is the measured part of one load level; a fifth of it runs before as warm-up.
func (r *runner) stepDuration() time.Duration { return r.cfg.Duration / 2 }

// runOverload sweeps the first target from 1× to 10× of its capacity, and every other
// target with the same publisher counts, so that each level compares the targets under the
// same number of clients. For jetgres started in-process it then starts a second node whose
// lanes are fixed at FixedConcurrency and sweeps it with those counts too, so the two differ
// only in the limiter.
func (r *runner) runOverload(ctx context.Context) {
	var first *Overload
	for _, t := range r.targets {
		ov, err := r.overload(ctx, t, nil, first)
		if err != nil {
			r.fail(SectionOverload, t, err)
			continue
		}
		r.rep.Overload = append(r.rep.Overload, ov)
		if first == nil {
			first = &ov
		}
		if t.node == nil || t.name != TargetJetgres {
			continue
		}
		fixed, err := r.fixedTarget(ctx)
		if err != nil {
			r.fail(SectionOverload, &benchTarget{name: TargetJetgresFixed}, err)
			continue
		}
		ovf, err := r.overload(ctx, fixed, &ov, nil)
		if stopErr := fixed.node.stop(); stopErr != nil {
			r.fail(SectionOverload, fixed, stopErr)
		}
		if err != nil {
			r.fail(SectionOverload, fixed, err)
			continue
		}
		r.rep.Overload = append(r.rep.Overload, ovf)
	}
}

// fixedTarget starts the jetgres node whose limiter is disabled: both lanes hold
// FixedConcurrency permits whatever the round trips do.
func (r *runner) fixedTarget(ctx context.Context) (*benchTarget, error) {
	n, err := startJetgres(ctx, r.dsn, r.cfg.SynchronousCommit, flow.NewFixed("append", FixedConcurrency), flow.NewFixed("pop", FixedConcurrency),
		flow.NewFixed("ack", FixedConcurrency), r.log)
	if err != nil {
		return nil, err
	}
	return &benchTarget{name: TargetJetgresFixed, url: n.url(), node: n}, nil
}

// overload runs one target's sweep. like, when set, is a sweep of the same system to copy
// the calibration and load levels from, so that two configurations see identical publisher
// counts. counts, when set, is another target's sweep to copy only the publisher counts
// from: the target is still calibrated, but its levels keep the other's multiples.
func (r *runner) overload(ctx context.Context, t *benchTarget, like, counts *Overload) (Overload, error) {
	nstreams := r.overloadStreams()
	subjects := make([]string, nstreams)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("ovl.%d", i)
	}
	pubs := make([]publishFunc, 0, overloadConns)
	if t.naive != nil {
		if err := t.naive.Reset(ctx); err != nil {
			return Overload{}, err
		}
		pubs = append(pubs, r.publisher(t, nil))
	} else {
		r.prog.phase(fmt.Sprintf("overload: %d streams on %s", nstreams, t.name), int64(nstreams), 0)
		admin, err := dial(t.url, "jetgres-bench-overload-admin")
		if err != nil {
			return Overload{}, err
		}
		defer admin.close()
		for i, subj := range subjects {
			name := fmt.Sprintf("BENCH_OVL_%d", i)
			if _, err := admin.createStream(ctx, name, subj); err != nil {
				return Overload{}, err
			}
			defer r.cleanup(t, admin.deleteStream, name)
			r.prog.add(1)
		}
		for range overloadConns {
			c, err := dial(t.url, "jetgres-bench-overload")
			if err != nil {
				return Overload{}, err
			}
			defer c.close()
			pubs = append(pubs, r.publisher(t, c))
		}
	}

	ov := Overload{Target: t.name, CalibrationPublishers: calibrationPublishers}
	if like != nil {
		ov.LoneP50us, ov.Capacity = like.LoneP50us, like.Capacity
	} else {
		r.prog.phase(fmt.Sprintf("overload: lone publisher %s", t.name), 0, r.stepDuration())
		h, _, _, err := r.loneLoop(ctx, pubs[0], subjects[0], r.stepDuration(), r.cfg.Msgs)
		if err != nil {
			return Overload{}, fmt.Errorf("lone publisher: %w", err)
		}
		ov.LoneP50us = h.Summary().P50us
		cal, err := r.step(ctx, t, pubs, subjects, calibrationPublishers, "calibration")
		if err != nil {
			return Overload{}, fmt.Errorf("calibration: %w", err)
		}
		ov.Capacity = cal.MsgsPerSec
		ov.Peak = cal.MsgsPerSec
	}
	if ov.Capacity <= 0 || ov.LoneP50us <= 0 {
		return Overload{}, errors.New("calibration measured no throughput")
	}

	multiples := multiplesFull
	if r.cfg.Quick {
		multiples = multiplesQuick
	}
	prev := 0
	for i, k := range multiples {
		var n int
		switch {
		case like != nil && i < len(like.Steps):
			n = like.Steps[i].Publishers
		case counts != nil && i < len(counts.Steps):
			n = counts.Steps[i].Publishers
		default:
			// n publishers offer n / lone-latency messages per second if the target answered
			// each as fast as when idle; pick n so that this is k × capacity.
			n = int(math.Round(k * ov.Capacity * ov.LoneP50us / 1e6))
			n = min(max(n, prev+1), MaxPublishers)
		}
		prev = n
		st, err := r.step(ctx, t, pubs, subjects, n, fmt.Sprintf("%gx", k))
		if err != nil {
			return Overload{}, fmt.Errorf("%g× capacity (%d publishers): %w", k, n, err)
		}
		st.Multiple = k
		st.Offered = float64(n) / (ov.LoneP50us / 1e6)
		ov.Steps = append(ov.Steps, st)
		ov.Peak = max(ov.Peak, st.MsgsPerSec)
	}
	// A last step at MaxPublishers shows the many-clients regime past 10×, where a fixed
	// lane of FixedConcurrency can actually fill up.
	if prev < MaxPublishers {
		st, err := r.step(ctx, t, pubs, subjects, MaxPublishers, "max")
		if err != nil {
			return Overload{}, fmt.Errorf("%d publishers: %w", MaxPublishers, err)
		}
		st.Offered = float64(MaxPublishers) / (ov.LoneP50us / 1e6)
		st.Multiple = math.Round(10*st.Offered/ov.Capacity) / 10
		ov.Steps = append(ov.Steps, st)
		ov.Peak = max(ov.Peak, st.MsgsPerSec)
	}
	return ov, nil
}

// step runs n closed-loop synchronous publishers, publisher i on subjects[i % len], for a
// warm-up and then stepDuration, and reports what completed inside the measured window.
func (r *runner) step(ctx context.Context, t *benchTarget, pubs []publishFunc, subjects []string, n int, label string) (OverloadStep, error) {
	return r.stepAfter(ctx, t, pubs, subjects, n, label, r.stepDuration()/5)
}

// stepAfter is step with a warm-up of its own; with none, it measures from the first publish.
func (r *runner) stepAfter(ctx context.Context, t *benchTarget, pubs []publishFunc, subjects []string, n int, label string, warm time.Duration) (OverloadStep, error) {
	d := r.stepDuration()
	r.prog.phase(fmt.Sprintf("overload %-5s %4d pubs %s", label, n, t.name), 0, warm+d)
	payload := make([]byte, r.cfg.Size)
	from := time.Now().Add(warm)
	until := from.Add(d)
	var h syncHistogram
	var ok, failed atomic.Int64
	var fatal firstError
	var wg sync.WaitGroup
	for i := range n {
		pub, subj := pubs[i%len(pubs)], subjects[i%len(subjects)]
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(until) {
				octx, cancel := context.WithTimeout(ctx, opTimeout)
				t0 := time.Now()
				err := pub(octx, subj, payload)
				t1 := time.Now()
				cancel()
				if errors.Is(err, nats.ErrConnectionClosed) {
					fatal.set(err)
					return
				}
				if t0.Before(from) || t1.After(until) {
					continue
				}
				if err != nil {
					failed.Add(1)
					continue
				}
				h.Record(t1.Sub(t0))
				ok.Add(1)
				r.prog.add(1)
			}
		})
	}
	wg.Wait()
	if fatal.err != nil {
		return OverloadStep{}, fatal.err
	}
	if err := ctx.Err(); err != nil {
		return OverloadStep{}, err
	}
	st := OverloadStep{
		Publishers: n,
		MsgsPerSec: float64(ok.Load()) / d.Seconds(),
		Errors:     int(failed.Load()),
		Latency:    h.snapshot().Summary(),
	}
	if t.node != nil {
		st.AppendLimit = t.node.appends.Stats().Limit
	}
	return st, nil
}
