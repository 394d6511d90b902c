package bridge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// While an append transaction is in flight, publishes to other streams wait for it and go out
// together in the next one; only once it has run for FlushOverlapAfter (here: hung on a row
// lock another session holds) does the next start beside it, so one hung stream leaves the
// lane to every other. The clock stands still until the test moves it, so nothing overlaps
// before then whatever the machine's speed.
func TestFlushWaitsForTheOneInFlight(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	for _, name := range []string{"HUNG", "B", "C"} {
		newStream(t, ctx, tb, name, name+".>")
	}
	probe := rawsql.Open(t, tb.dbURL)
	release := probe.HoldRows(t, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, tb.bridge.streams.Lookup("HUNG").ID())

	publish := func(subject string) <-chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			_, err := tb.js.Publish(ctx, subject, []byte("x"))
			done <- err
		}()
		return done
	}
	// Taken before: a flush shows as in flight before it counts its transaction.
	before := histograms(t, tb)["jetgres_fusion_streams_per_transaction"]
	hung := publish("HUNG.x")
	const ahead = time.Second
	testwait.For(t, 10*time.Second, func() error {
		if age := tb.bridge.OldestFlush(clock.Now().Add(ahead)); age != ahead {
			return fmt.Errorf("no flush in flight yet (oldest %s ahead: %s)", ahead, age)
		}
		return nil
	})

	b, c := publish("B.x"), publish("C.x")
	testwait.For(t, 10*time.Second, func() error {
		if n := gaugeValue(t, tb.reg, "jetgres_fusion_streams_waiting"); n != 2 {
			return errors.New("B and C are not both waiting for the next transaction yet")
		}
		if !clock.TimerDueIn(FlushOverlapAfterDefault) {
			return errors.New("the dispatcher is not waiting out the transaction in flight yet")
		}
		return nil
	})
	for name, ch := range map[string]<-chan error{"B": b, "C": c} {
		select {
		case err := <-ch:
			t.Fatalf("the publish to %s was answered (%v) while the transaction in flight was younger than FlushOverlapAfter", name, err)
		default:
		}
	}
	if n := counterValue(t, tb.reg, "jetgres_fusion_overlaps_total"); n != 0 {
		t.Fatalf("overlaps before the clock moved: %v, want 0", n)
	}

	clock.Advance(FlushOverlapAfterDefault)
	for name, ch := range map[string]<-chan error{"B": b, "C": c} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("the publish to %s beside the hung transaction: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the publish to %s waited on the hung transaction past FlushOverlapAfter", name)
		}
	}
	if n := counterValue(t, tb.reg, "jetgres_fusion_overlaps_total"); n != 1 {
		t.Fatalf("overlaps: %v, want 1", n)
	}
	after := histograms(t, tb)["jetgres_fusion_streams_per_transaction"]
	// HUNG's alone, then B and C's together.
	if got := after.count - before.count; got != 2 || after.sum-before.sum != 3 {
		t.Fatalf("HUNG, B and C went out in %v transactions of %v streams in all, want 2 of 3", got, after.sum-before.sum)
	}
	select {
	case err := <-hung:
		t.Fatalf("the hung publish was answered (%v) while its row was locked", err)
	default:
	}
	release()
	if err := <-hung; err != nil {
		t.Fatalf("the hung publish once the lock was released: %v", err)
	}
	info, err := tb.js.Stream(ctx, "HUNG")
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != 1 {
		t.Fatalf("HUNG holds %d messages, want 1", got)
	}
}
