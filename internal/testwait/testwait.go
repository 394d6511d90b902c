// Package testwait owns the one way tests in this module wait for something to become true:
// poll a condition until it holds or a deadline passes, then fail with what the condition
// last reported. A test that waits this way can fail; a bare sleep can only guess.
package testwait

import (
	"testing"
	"time"
)

// The pause between two calls starts short, so that a condition which holds almost at once
// costs almost nothing, and grows to maxPause, so that a long wait does not spin on a machine
// shared with the server under test. It is never shorter than the last call took: a condition
// that does real work (a query, a child process) keeps at most half of a core busy.
const (
	firstPause = 100 * time.Microsecond
	maxPause   = 10 * time.Millisecond
)

// For calls cond until it returns nil. If within passes first, it fails t with cond's last
// error, which should say what was still wrong ("stored floor 1, want 3"). cond runs on the
// test's goroutine and at least once, so it may call t.Fatal.
func For(t testing.TB, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := firstPause
	for {
		began := time.Now()
		err := cond()
		if err == nil {
			return
		}
		now := time.Now()
		if !now.Before(deadline) {
			t.Fatalf("not within %v: %v", within, err)
		}
		time.Sleep(min(max(pause, now.Sub(began)), deadline.Sub(now)))
		pause = min(2*pause, maxPause)
	}
}
