// Package startstop is the one start/stop discipline of jetgres's long-lived parts, after
// River's package of the same name. A part holds a Group, starts it once, runs each of its
// goroutines through it, and stops it as often as it likes:
//
//   - Start succeeds once. A second Start, or a Start after Stop, fails, so that a part is
//     never running twice over the same state.
//   - Go refuses to start a goroutine once Stop has begun: nothing starts behind a Stop and
//     outlives it, even when a callback from another goroutine races with it.
//   - Stop is idempotent and safe before Start and after a failed one. It cancels the
//     group's context and returns only once every goroutine Go started has returned, so the
//     goroutines must end when that context does.
//   - Wait waits for the goroutines without cancelling them, for a graceful drain bounded by
//     the caller's context; Stop follows it to end what the drain left.
package startstop

import (
	"context"
	"errors"
	"sync"
)

var (
	// ErrStarted is Start's answer when the group already started.
	ErrStarted = errors.New("startstop: already started")
	// ErrStopped is Start's answer when the group was stopped: a stopped group stays stopped.
	ErrStopped = errors.New("startstop: stopped")
)

type state uint8

const (
	idle state = iota
	running
	stopped
)

// Group is a set of goroutines that share one context. The zero value is ready to Start.
type Group struct {
	mu     sync.Mutex
	state  state
	cancel context.CancelFunc
	n      int           // goroutines running
	none   chan struct{} // closed when n drops to zero; made anew when it rises from zero
}

// Start makes the group's context, a child of parent, and returns it; the goroutines watch
// it. It fails with ErrStarted or ErrStopped unless the group is new.
func (g *Group) Start(parent context.Context) (context.Context, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case running:
		return nil, ErrStarted
	case stopped:
		return nil, ErrStopped
	}
	ctx, cancel := context.WithCancel(parent)
	g.state, g.cancel = running, cancel
	return ctx, nil
}

// Go runs f on a goroutine of the group. It reports false, and f does not run, before
// Start or once Stop has begun; the caller undoes whatever it prepared for f.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	if g.state != running {
		g.mu.Unlock()
		return false
	}
	if g.n == 0 {
		g.none = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
	go func() {
		defer g.done()
		f()
	}()
	return true
}

func (g *Group) done() {
	g.mu.Lock()
	g.n--
	if g.n == 0 {
		close(g.none)
	}
	g.mu.Unlock()
}

// Wait waits until none of the group's goroutines runs, or until ctx ends, whose error it
// then returns. It stops nothing: Go may start more goroutines afterwards.
func (g *Group) Wait(ctx context.Context) error {
	g.mu.Lock()
	if g.n == 0 {
		g.mu.Unlock()
		return nil
	}
	none := g.none
	g.mu.Unlock()
	select {
	case <-none:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop refuses new goroutines, cancels the group's context and waits for every goroutine
// still running. Calls after the first wait the same way and return when it does.
func (g *Group) Stop() {
	g.mu.Lock()
	g.state = stopped
	cancel, n, none := g.cancel, g.n, g.none
	g.mu.Unlock()
	if cancel == nil {
		return // never started
	}
	cancel()
	if n > 0 {
		<-none
	}
}
