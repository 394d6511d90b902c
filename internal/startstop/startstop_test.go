package startstop

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartOnce(t *testing.T) {
	var g Group
	if _, err := g.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Start(t.Context()); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: err = %v, want ErrStarted", err)
	}
	g.Stop()
	if _, err := g.Start(t.Context()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop: err = %v, want ErrStopped", err)
	}
}

func TestStopBeforeStart(t *testing.T) {
	var g Group
	g.Stop()
	g.Stop()
	if g.Go(func() { t.Error("ran after Stop") }) {
		t.Fatal("Go accepted a goroutine after Stop")
	}
	if _, err := g.Start(t.Context()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop: err = %v, want ErrStopped", err)
	}
}

func TestGoBeforeStart(t *testing.T) {
	var g Group
	if g.Go(func() { t.Error("ran before Start") }) {
		t.Fatal("Go accepted a goroutine before Start")
	}
}

// Stop cancels the context and returns only after every goroutine returned; Go refuses
// afterwards. goleak in TestMain catches a goroutine left behind.
func TestStopCancelsAndWaits(t *testing.T) {
	var g Group
	ctx, err := g.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	ended := make(chan struct{}, n)
	for range n {
		if !g.Go(func() {
			<-ctx.Done()
			time.Sleep(time.Millisecond) // returns a little after the cancel, not with it
			ended <- struct{}{}
		}) {
			t.Fatal("Go refused a goroutine while running")
		}
	}
	g.Stop()
	if len(ended) != n {
		t.Fatalf("Stop returned with %d of %d goroutines ended", len(ended), n)
	}
	if ctx.Err() == nil {
		t.Fatal("Stop left the group's context alive")
	}
	if g.Go(func() { t.Error("ran after Stop") }) {
		t.Fatal("Go accepted a goroutine after Stop")
	}
	g.Stop() // idempotent
}

func TestWait(t *testing.T) {
	var g Group
	ctx, err := g.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	if err := g.Wait(t.Context()); err != nil {
		t.Fatalf("Wait on an empty group: %v", err)
	}
	release := make(chan struct{})
	g.Go(func() { <-release })

	short, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if err := g.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a busy group: err = %v, want the deadline", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Wait cancelled the group's context")
	}
	close(release)
	if err := g.Wait(t.Context()); err != nil {
		t.Fatalf("Wait after the goroutine returned: %v", err)
	}
	// The group is still running: a goroutine after a Wait is accepted.
	done := make(chan struct{})
	if !g.Go(func() { close(done) }) {
		t.Fatal("Go refused a goroutine after Wait")
	}
	<-done
}
