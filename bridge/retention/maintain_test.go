package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
)

// start starts the engine of b, returns once its maintainer waits on the clock, and stops
// it when the test ends.
func (b *bundle) start(t *testing.T) {
	t.Helper()
	if err := b.e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.e.Stop)
	testwait.For(t, 10*time.Second, func() error {
		if !b.clock.TimerDueIn(time.Hour) {
			return errors.New("the maintainer is not waiting yet")
		}
		return nil
	})
}

// tick moves the clock one maintainPeriod on and waits until done holds.
func (b *bundle) tick(t *testing.T, done func(f *fakeStore) error) {
	t.Helper()
	b.clock.Advance(maintainPeriod)
	testwait.For(t, 10*time.Second, func() (err error) {
		b.store.read(func(f *fakeStore) { err = done(f) })
		return err
	})
}

// Every maintainPeriod the maintainer refreshes the storage usage, applies max_age, drops
// the chunks PostgreSQL names and, once a reapPeriod, reaps chunk tables no stream lists.
func TestMaintainerTick(t *testing.T) {
	t.Parallel()
	aged := newStream(1, server.LimitsPolicy)
	aged.cfg.MaxAge = time.Minute
	plain := newStream(2, server.LimitsPolicy)
	plain.closeRows = 500
	b := setup(t, aged, plain)
	b.store.expired = 1
	b.store.candidates = []int64{7}
	b.start(t)
	expiries := func(n int) func(f *fakeStore) error {
		return func(f *fakeStore) error {
			if len(f.expiries) != n {
				return fmt.Errorf("%d expiries, want %d", len(f.expiries), n)
			}
			return nil
		}
	}
	b.tick(t, expiries(1))
	testwait.For(t, 10*time.Second, func() error {
		b.host.mu.Lock()
		defer b.host.mu.Unlock()
		if b.host.refreshes != 2 {
			return fmt.Errorf("%d usage refreshes, want one at Start and one a tick", b.host.refreshes)
		}
		return nil
	})
	b.store.read(func(f *fakeStore) {
		if want := (cutoff{1, b.clock.Now().Add(-time.Minute).UnixNano()}); f.expiries[0] != want {
			t.Fatalf("expired before %v, want %v", f.expiries[0], want)
		}
		if !slices.Equal(f.dropped, []int64{7}) || f.reaps != 1 {
			t.Fatalf("dropped chunks of %v and reaped %d times, want 7 and once", f.dropped, f.reaps)
		}
		want := []pg.ChunkClose{{StreamID: 1, Rows: pg.ChunkRowsMin, Before: b.clock.Now().Add(-time.Minute / 4).UnixNano()},
			{StreamID: 2, Rows: 500, Before: b.clock.Now().Add(-pg.ChunkCloseAge).UnixNano()}}
		if !slices.Equal(f.closes, want) {
			t.Fatalf("closed chunks %+v, want %+v: the stream with a max_age at a quarter of it, the other at its size", f.closes, want)
		}
	})
	wantEvents(t, b.host, "purged S1 first=0 consumed=false")

	for i := range int(reapPeriod/maintainPeriod) - 1 {
		b.tick(t, expiries(i+2))
	}
	b.store.read(func(f *fakeStore) {
		if f.reaps != 1 {
			t.Fatalf("reaped %d times within a reapPeriod, want once", f.reaps)
		}
	})
	b.tick(t, func(f *fakeStore) error {
		if f.reaps != 2 {
			return fmt.Errorf("reaped %d times a reapPeriod on, want twice", f.reaps)
		}
		return nil
	})
}

// An ack wakes the maintainer at once for a pass over its stream; a pass that left acks
// for their consumer to apply comes again retainRetry later.
func TestAcksWakeTheMaintainer(t *testing.T) {
	t.Parallel()
	s := newStream(3, server.WorkQueuePolicy)
	b := setup(t, s)
	b.store.consumers[3] = []pg.Consumer{consumer(t, 3, "w", 0)}
	b.host.serve("w", ConsumerProgress{Floor: 0, Next: 5, Pending: []uint64{2}})
	b.start(t)
	passes := func(n int) func() error {
		return func() error {
			if got := listed(b.store); got != n {
				return fmt.Errorf("%d passes, want %d", got, n)
			}
			return nil
		}
	}
	b.e.NoteAck(s, "w", 2, ack)
	testwait.For(t, 10*time.Second, passes(1))
	testwait.For(t, 10*time.Second, func() error {
		if !b.clock.TimerDueIn(retainRetry) {
			return fmt.Errorf("no retry armed")
		}
		return nil
	})
	b.host.serve("w", ConsumerProgress{Floor: 0, Next: 5})
	b.clock.Advance(retainRetry)
	testwait.For(t, 10*time.Second, passes(2))
	wantRetains(t, b.store, 0, pg.RetainParams{StreamID: 3, WorkQueue: true,
		Consumers: []pg.RetainConsumer{{Floor: 0}}, Recheck: everything},
		pg.RetainParams{StreamID: 3, WorkQueue: true, Consumers: []pg.RetainConsumer{{Floor: 0, Acked: []uint64{2}}}})
}

// A stream's de-duplication ids are pruned once a window, at most once a pruneIDsPeriod and
// at least a maintainPeriod apart, measured back from the start of a flush in flight when
// that is older. A stream seen for the first time waits a period.
func TestPruneIDsOncePerWindow(t *testing.T) {
	t.Parallel()
	long := newStream(4, server.LimitsPolicy)
	long.cfg.Duplicates = 2 * time.Minute
	short := newStream(5, server.LimitsPolicy)
	short.cfg.Duplicates = 5 * time.Second
	b := setup(t, long, short)
	step := func(name string, want ...cutoff) {
		t.Helper()
		var before int
		b.store.read(func(f *fakeStore) { before = len(f.prunes) })
		b.e.pruneIDs(t.Context())
		b.store.read(func(f *fakeStore) {
			if got := f.prunes[before:]; !slices.Equal(got, want) {
				t.Fatalf("%s: pruned %v, want %v", name, got, want)
			}
		})
	}
	at := func(id int64, window time.Duration) cutoff {
		return cutoff{id, b.clock.Now().Add(-window).UnixNano()}
	}
	step("first look")
	b.clock.Advance(4 * time.Second)
	step("within the short window")
	b.clock.Advance(time.Second)
	step("a short window on", at(5, 5*time.Second))
	b.clock.Advance(55 * time.Second)
	step("a period on", at(4, 2*time.Minute), at(5, 5*time.Second))

	flush := b.clock.Now().Add(-10 * time.Second)
	short.flush.Store(flush.UnixNano())
	b.clock.Advance(5 * time.Second)
	step("with a flush in flight", cutoff{5, flush.Add(-5 * time.Second).UnixNano()})

	short.flush.Store(0)
	b.host.setStreams(long)
	b.clock.Advance(time.Minute)
	step("a stream gone", at(4, 2*time.Minute))
	b.host.setStreams(long, short)
	b.clock.Advance(time.Minute)
	step("seen again", at(4, 2*time.Minute))
	b.clock.Advance(5 * time.Second)
	step("a short window after", at(5, 5*time.Second))
}

// An engine starts once, and Stop is safe twice and before Start; New refuses a
// configuration without its store or host.
func TestStartStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.e.Stop()
	if err := b.e.Start(t.Context()); !errors.Is(err, startstop.ErrStopped) {
		t.Fatalf("start after stop: %v", err)
	}
	b = setup(t)
	if err := b.e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.e.Start(t.Context()); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("second start: %v", err)
	}
	b.e.Stop()
	b.e.Stop()
	if _, err := New(Config[*fakeStream]{}); err == nil {
		t.Fatal("New took a configuration without store and host")
	}
}
