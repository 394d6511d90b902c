package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// OldestFlush measures a hung append transaction on the bridge's clock, from the moment its
// flush started, and forgets it once it commits.
func TestOldestFlushOnAHungCommit(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	newStream(t, ctx, tb, "S", "s.>")
	id := tb.bridge.streams.Lookup("S").ID()
	if age := tb.bridge.OldestFlush(clock.Now()); age != 0 {
		t.Fatalf("OldestFlush with nothing in flight: %s, want 0", age)
	}
	probe := rawsql.Open(t, tb.dbURL)
	release := probe.HoldRows(t, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, id)

	acked := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := tb.js.Publish(ctx, "s.x", []byte("held"))
		acked <- err
	}()
	// The fake clock stands still, so a flush in flight is exactly as old as the time
	// asked about is ahead of it.
	const ahead = 7 * time.Second
	testwait.For(t, 10*time.Second, func() error {
		if age := tb.bridge.OldestFlush(clock.Now().Add(ahead)); age != ahead {
			return fmt.Errorf("OldestFlush %s ahead of the clock: %s, want %s", ahead, age, ahead)
		}
		return nil
	})
	release()
	if err := <-acked; err != nil {
		t.Fatalf("the held publish: %v", err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if age := tb.bridge.OldestFlush(clock.Now().Add(ahead)); age != 0 {
			return fmt.Errorf("OldestFlush after the commit: %s, want 0", age)
		}
		return nil
	})
}
