package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// De-duplication ids answer within the window, and once a stream has gone a window without
// new ids the maintainer drops every table that held them: nothing of them stays on disk,
// and an id sent again after that is stored anew.
func TestMsgIDsDroppedOnceTheWindowHasPassed(t *testing.T) {
	t.Parallel()
	clk := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clk }})
	ctx := testContext(t)
	raw := rawsql.Open(t, tb.dbURL)
	const window = 10 * time.Second
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "W", Subjects: []string{"w"}, Duplicates: window}); err != nil {
		t.Fatal(err)
	}
	pub := func(id string, seq uint64, dup bool) {
		t.Helper()
		ack, err := tb.js.Publish(ctx, "w", []byte(id), jetstream.WithMsgID(id))
		if err != nil || ack.Sequence != seq || ack.Duplicate != dup {
			t.Fatalf("publish %s: %+v, %v; want seq %d duplicate %v", id, ack, err, seq, dup)
		}
	}
	buckets := func() (n int) {
		t.Helper()
		if err := raw.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'jetgres' AND tablename LIKE 'ids\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	pub("a", 1, false)
	pub("a", 1, true)
	clk.Advance(window / 2)
	pub("a", 1, true)
	clk.Advance(window)
	pub("b", 2, false) // a window after "a": a table of its own
	pub("a", 3, false) // past its window: stored anew
	pub("b", 2, true)
	// The maintainer may or may not have dropped the first table yet.
	if n := buckets(); n < 1 || n > 2 {
		t.Fatalf("%d id tables, want 1 or 2", n)
	}
	testwait.For(t, 30*time.Second, func() error {
		clk.Advance(time.Second)
		if n := buckets(); n > 0 {
			return fmt.Errorf("%d id tables left", n)
		}
		return nil
	})
	pub("b", 4, false)
	pub("b", 4, true)
}
