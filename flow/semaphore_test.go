package flow

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// checkInvariant fails unless waiters exist only while every permit is held: otherwise a free
// permit would sit unused while someone waits for it.
func (s *semaphore) checkInvariant(t *testing.T, maxSize int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters.Len() > 0 && s.held < s.size {
		t.Errorf("%d waiting with %d of %d permits held", s.waiters.Len(), s.held, s.size)
	}
	if s.held > maxSize {
		t.Errorf("%d permits held, never more than %d were allowed", s.held, maxSize)
	}
}

func TestSemaphoreShrinkRetiresOnRelease(t *testing.T) {
	s := &semaphore{size: 3}
	for range 3 {
		s.tryAcquire()
	}
	s.resize(1)
	if size, held, _ := s.state(); size != 1 || held != 3 {
		t.Fatalf("size, held = %d, %d, want 1, 3", size, held)
	}
	s.release()
	s.release()
	if s.tryAcquire() {
		t.Fatal("tryAcquire succeeded with 1 held of 1")
	}
	s.release()
	if !s.tryAcquire() {
		t.Fatal("tryAcquire failed with 0 held of 1")
	}
}

func TestSemaphoreReleaseWithoutAcquirePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("release on an unheld semaphore did not panic")
		}
	}()
	s := &semaphore{size: 1}
	s.release()
}

// Cancellation racing a grant must neither lose the permit nor hand it out twice.
func TestSemaphoreCancelRacingRelease(t *testing.T) {
	for range 2000 {
		s := &semaphore{size: 1}
		s.tryAcquire()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if s.acquire(ctx) == nil {
				s.release()
			}
		}()
		go cancel()
		s.release()
		<-done
		cancel()
		if _, held, waiting := s.state(); held != 0 || waiting != 0 {
			t.Fatalf("held %d, waiting %d after everyone left, want 0, 0", held, waiting)
		}
	}
}

func TestSemaphoreStress(t *testing.T) {
	const maxSize = 8
	s := &semaphore{size: 4}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for range 2000 {
				switch op := rand.IntN(10); {
				case op == 0 && g < 4:
					s.resize(1 + rand.IntN(maxSize))
				case op < 5:
					if s.tryAcquire() {
						s.checkInvariant(t, maxSize)
						s.release()
					}
				default:
					// The timeout turns a leaked permit into a failure instead of a hang.
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if op == 9 {
						cancel()
					} else if op == 8 {
						go cancel()
					}
					switch err := s.acquire(ctx); {
					case err == nil:
						s.checkInvariant(t, maxSize)
						s.release()
					case errors.Is(err, context.DeadlineExceeded):
						t.Error("acquire waited 10s: permits were lost")
					}
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if _, held, waiting := s.state(); held != 0 || waiting != 0 {
		t.Fatalf("held %d, waiting %d at the end, want 0, 0", held, waiting)
	}
}
