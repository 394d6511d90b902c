package flow

import (
	"container/list"
	"context"
	"sync"
)

// semaphore is a counting semaphore whose size can change while permits are out.
//
// Shrinking below the number held revokes nothing: the surplus permits retire as they come back,
// so a smaller limit takes effect as work drains. Waiters are served strictly in arrival order,
// and a permit freed while anyone waits is handed to the head of the queue inside release, so
// neither tryAcquire nor a newly arriving acquire can overtake a waiter. That hand-off keeps the
// invariant that waiters exist only while held >= size.
type semaphore struct {
	mu      sync.Mutex
	size    int
	held    int       // may exceed size after a shrink
	waiters list.List // of chan struct{}, closed when that waiter has been given a permit
}

// acquire takes a permit, waiting in line if none is free. It fails with ctx.Err() if ctx is
// done before a permit is granted (already-done contexts fail even when a permit is free);
// a permit granted in the same instant as the cancellation is handed on, never kept.
func (s *semaphore) acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.held < s.size {
		s.held++
		s.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	elem := s.waiters.PushBack(ready)
	s.mu.Unlock()

	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-ready:
			s.releaseLocked()
		default:
			s.waiters.Remove(elem)
		}
		s.mu.Unlock()
		return ctx.Err()
	}
}

func (s *semaphore) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held >= s.size {
		return false
	}
	s.held++
	return true
}

func (s *semaphore) release() {
	s.mu.Lock()
	s.releaseLocked()
	s.mu.Unlock()
}

func (s *semaphore) releaseLocked() {
	if s.held == 0 {
		panic("flow: semaphore released more often than acquired")
	}
	s.held--
	s.grantLocked()
}

// resize sets the number of permits. Growing hands the new permits to waiters at once.
func (s *semaphore) resize(n int) {
	s.mu.Lock()
	s.size = n
	s.grantLocked()
	s.mu.Unlock()
}

func (s *semaphore) grantLocked() {
	for s.held < s.size && s.waiters.Len() > 0 {
		ready := s.waiters.Remove(s.waiters.Front()).(chan struct{})
		s.held++
		close(ready)
	}
}

func (s *semaphore) state() (size, held, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size, s.held, s.waiters.Len()
}
