package flow

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newFakeClock returns a clock that stands still until advanced, so the 60-second rtt_base
// window can be walked through without waiting for it, at a time the tests can write down.
func newFakeClock() *clocktest.Fake {
	return clocktest.At(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
}

// seedOptions are a lane with the seed's defaults (the pop lane's) on clk.
func seedOptions(clk clock.Clock) Options {
	return Options{
		Init: PopInitDefault, Min: PopMinDefault, Max: PopMaxDefault,
		Alpha: AlphaDefault, Beta: BetaDefault, Clock: clk,
	}
}

func newTestLane(t *testing.T, opts Options) *Lane {
	t.Helper()
	l, err := NewLane(t.Name(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitWaiting waits until n callers are queued in l's Acquire.
func waitWaiting(t *testing.T, l *Lane, n int) {
	t.Helper()
	testwait.For(t, 10*time.Second, func() error {
		if got := l.Stats().Waiting; got != n {
			return fmt.Errorf("%d waiters queued, want %d", got, n)
		}
		return nil
	})
}

// takeAll takes every free permit of l.
func takeAll(t *testing.T, l *Lane) []*Permit {
	t.Helper()
	var ps []*Permit
	for {
		p, ok := l.TryAcquire()
		if !ok {
			return ps
		}
		ps = append(ps, p)
	}
}

// drivenSample saturates l, completes one operation with rtt and gives the other permits back
// unrecorded: one completion of a fully driven lane. A fake clock moves on by rtt, since the
// operation took that long: the limiter reacts only to operations that started after its last
// adjustment.
func drivenSample(t *testing.T, l *Lane, rtt time.Duration) {
	t.Helper()
	ps := takeAll(t, l)
	if len(ps) == 0 {
		t.Fatal("no free permit to drive the lane with")
	}
	if c, ok := l.clock.(*clocktest.Fake); ok {
		c.Advance(rtt)
	}
	ps[0].Release(rtt)
	for _, p := range ps[1:] {
		p.Abandon()
	}
}

// idleSample completes one operation on an otherwise idle lane: recorded, never adjusting.
func idleSample(t *testing.T, l *Lane, rtt time.Duration) {
	t.Helper()
	p, ok := l.TryAcquire()
	if !ok {
		t.Fatal("lane is not idle")
	}
	p.Release(rtt)
}

type acquireResult struct {
	p   *Permit
	err error
}

// acquireAsync calls l.Acquire on a goroutine of its own.
func acquireAsync(ctx context.Context, l *Lane) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		p, err := l.Acquire(ctx)
		ch <- acquireResult{p, err}
	}()
	return ch
}
