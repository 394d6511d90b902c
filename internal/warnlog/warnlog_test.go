package warnlog

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

// recordHandler keeps what is logged through it.
type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// take returns the records logged since the last take, each as its "suppressed" count
// (-1 without one).
func (h *recordHandler) take() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, r := range h.recs {
		n := int64(-1)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "suppressed" {
				n = a.Value.Int64()
			}
			return true
		})
		out = append(out, n)
	}
	h.recs = nil
	return out
}

// A warning repeated on every failed attempt reaches the log once per Every of the
// caller's clock, the next line counting the ones left out, however many goroutines fail.
func TestThrottleThinsRepeatedWarnings(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	h := &recordHandler{}
	log := slog.New(h)
	var l Throttle
	want := func(step string, lines ...int64) {
		t.Helper()
		got := h.take()
		if len(got) != len(lines) {
			t.Fatalf("%s: %d lines %v, want %v", step, len(got), got, lines)
		}
		for i := range got {
			if got[i] != lines[i] {
				t.Fatalf("%s: suppressed counts %v, want %v", step, got, lines)
			}
		}
	}

	l.Warn(log, clock.Now(), "failed", "err", "down")
	want("first", -1)
	for range 100 {
		clock.Advance(Every / 200)
		l.Warn(log, clock.Now(), "failed", "err", "down")
	}
	want("within the interval")
	clock.Advance(Every / 2)
	l.Warn(log, clock.Now(), "failed", "err", "down")
	want("after the interval", 100)
	clock.Advance(Every)
	l.Warn(log, clock.Now(), "failed", "err", "down")
	want("after a quiet interval", -1)

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				l.Warn(log, clock.Now(), "failed", "err", "down")
			}
		})
	}
	wg.Wait()
	want("concurrent, within the interval")
	clock.Advance(Every + time.Nanosecond)
	wg = sync.WaitGroup{}
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				l.Warn(log, clock.Now(), "failed", "err", "down")
			}
		})
	}
	wg.Wait()
	want("concurrent, past the interval", 8000)
	clock.Advance(Every)
	l.Warn(log, clock.Now(), "failed", "err", "down")
	want("the rest", 7999)
}
