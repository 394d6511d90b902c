package bridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// idle reports which of the groups still has a goroutine running.
func idle(groups map[string]func(context.Context) error) error {
	now, cancel := context.WithCancel(context.Background())
	cancel()
	var busy []string
	for name, wait := range groups {
		if wait(now) != nil {
			busy = append(busy, name)
		}
	}
	if len(busy) > 0 {
		return fmt.Errorf("goroutines still running in %s", strings.Join(busy, ", "))
	}
	return nil
}

func (b *Bridge) groups() map[string]func(context.Context) error {
	return map[string]func(context.Context) error{"background work": b.bg.Wait, "streams": b.streams.Wait, "consumer side": b.cons.Wait}
}

// A Start that fails part-way, here because the database stalls while it loads a stream's
// consumers and its ctx runs out, stops what it had started: the stream subscriptions, the
// background work and the consumers already loaded, whose leases it gives back. A Stop
// afterwards is a no-op, and a second Start is refused.
func TestStartFailurePartWayStopsEverything(t *testing.T) {
	t.Parallel()
	first := setup(t)
	ctx := testContext(t)
	for _, name := range []string{"A", "B"} {
		s := newStream(t, ctx, first, name, strings.ToLower(name)+".>")
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	idB := first.bridge.streams.Lookup("B").ID()
	first.stop(t)

	tb := setup(t, setupOpts{db: first.db, unstarted: true, config: func(c *Config) { c.ReplicaName = "restarted" }})
	probe := rawsql.Open(t, first.dbURL)
	probe.HoldRows(t, `SELECT 1 FROM jetgres.consumers WHERE stream_id = $1 FOR UPDATE`, idB)
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err := tb.bridge.Start(startCtx)
	if err == nil {
		t.Fatal("Start succeeded while stream B's consumers were locked")
	}
	if err := idle(tb.bridge.groups()); err != nil {
		t.Fatalf("after the failed Start: %v", err)
	}
	var held int
	if err := probe.QueryRow(ctx, `SELECT count(*) FROM jetgres.consumers WHERE owner = 'restarted'`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("the failed Start kept %d consumer leases", held)
	}
	// The stream subjects were given up: a publish finds nobody, where a bridge left half
	// running would still store and acknowledge it.
	testwait.For(t, 10*time.Second, func() error {
		_, err := tb.nc.Request("a.x", []byte("after"), 2*time.Second)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil
		}
		return fmt.Errorf("publish to a.x: %v, want no responders", err)
	})
	if err := tb.bridge.Stop(ctx); err != nil {
		t.Errorf("Stop after a failed Start: %v", err)
	}
	if err := tb.bridge.Start(ctx); !errors.Is(err, startstop.ErrStopped) {
		t.Errorf("Start after a failed Start: err = %v, want ErrStopped", err)
	}
}

// A Stop whose ctx runs out while a flush waits on the database cancels that flush and
// returns only once every goroutine the bridge started has returned: nothing commits
// behind its back.
func TestStopPastDeadlineLeavesNothingRunning(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	newStream(t, ctx, tb, "S", "s.>")
	id := tb.bridge.streams.Lookup("S").ID()
	probe := rawsql.Open(t, tb.dbURL)
	release := probe.HoldRows(t, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, id)

	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := tb.js.Publish(ctx, "s.x", []byte("stuck"))
		answered <- err
	}()
	testwait.For(t, 10*time.Second, func() error {
		if n := tb.bridge.cfg.Append.Stats().InFlight; n == 0 {
			return errors.New("no flush in flight yet")
		}
		return nil
	})

	const grace = 200 * time.Millisecond
	stopCtx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	began := time.Now()
	if err := tb.bridge.Stop(stopCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: err = %v, want the deadline", err)
	}
	// Cancelling a statement takes a round trip, not the statement timeout.
	if took := time.Since(began); took > grace+10*time.Second {
		t.Errorf("Stop took %v with a deadline of %v: the stuck flush was not cancelled", took, grace)
	}
	if err := idle(tb.bridge.groups()); err != nil {
		t.Fatalf("after Stop returned: %v", err)
	}
	release()
	var msgs int64
	if err := probe.QueryRow(ctx, `SELECT msgs FROM jetgres.stream_state WHERE stream_id = $1`, id).Scan(&msgs); err != nil {
		t.Fatal(err)
	}
	if msgs != 0 {
		t.Errorf("%d messages committed after Stop returned", msgs)
	}
	if err := <-answered; err == nil {
		t.Error("the cancelled publish was acknowledged")
	}
}
