package testwait

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// recorder stands in for the test so that For's failure can be looked at instead of failing.
type recorder struct {
	testing.TB
	failure string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls For with r on a goroutine of its own, as Fatalf ends the goroutine it runs on.
func run(r *recorder, within time.Duration, cond func() error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		For(r, within, cond)
	}()
	<-done
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	r := &recorder{TB: t}
	run(r, time.Minute, func() error {
		if calls++; calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if r.failure != "" || calls != 3 {
		t.Fatalf("failure %q after %d calls, want none after 3", r.failure, calls)
	}
}

func TestForFailsWithTheLastError(t *testing.T) {
	calls := 0
	r := &recorder{TB: t}
	began := time.Now()
	run(r, 50*time.Millisecond, func() error {
		calls++
		return fmt.Errorf("call %d still wrong", calls)
	})
	if took := time.Since(began); took < 50*time.Millisecond {
		t.Errorf("gave up after %v, before its deadline", took)
	}
	if want := fmt.Sprintf("call %d still wrong", calls); !strings.HasSuffix(r.failure, want) {
		t.Fatalf("failure %q, want it to end in %q", r.failure, want)
	}
}

func TestForCallsOnceWithNoTime(t *testing.T) {
	calls := 0
	r := &recorder{TB: t}
	run(r, 0, func() error {
		calls++
		return errors.New("wrong")
	})
	if calls != 1 || r.failure == "" {
		t.Fatalf("%d calls, failure %q; want one call and a failure", calls, r.failure)
	}
}
