package pg_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// A replica whose clock is five minutes ahead learns from one round trip how far it is from
// PostgreSQL's clock, and stores messages at PostgreSQL's time, not its own.
func TestMeasureClockMovesStoreTimesOntoPostgreSQLs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	clk := clocktest.At(time.Now().Add(5 * time.Minute))
	if _, ok := db.ClockOffset(); ok {
		t.Fatal("an offset is known before any measurement")
	}
	off, err := db.MeasureClock(ctx, clk)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := db.ClockOffset(); !ok || got != off {
		t.Fatalf("ClockOffset is %v, %v after measuring %v", got, ok, off)
	}
	// The test's machine and PostgreSQL's share a clock: the fake one is five minutes ahead.
	if d := off + 5*time.Minute; d > 5*time.Second || d < -5*time.Second {
		t.Fatalf("measured PostgreSQL's clock %v ahead of one five minutes fast", off)
	}
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s"}}}}, clk.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	ts := storedTimes(t, url, st.ID)
	if d := time.Since(time.Unix(0, ts[0])); d > 5*time.Second || d < -5*time.Second {
		t.Fatalf("stored at %v, %v from now", time.Unix(0, ts[0]), d)
	}
}

// Two replicas, one of them five minutes behind the other, append to one stream in turn,
// both paths (the fast path of the replica that stored last, the general path of the other):
// the store times never go backwards along the sequences.
func TestStoreTimesNeverGoBackwardsAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	ahead, behind := pgtest.OpenAt(t, url), pgtest.OpenAt(t, url)
	st, err := ahead.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, w := range []struct {
		db *pg.DB
		at time.Time
	}{
		{ahead, now}, {ahead, now.Add(time.Millisecond)},
		{behind, now.Add(-5 * time.Minute)}, {behind, now.Add(-5*time.Minute + time.Second)},
		{ahead, now.Add(2 * time.Millisecond)}, {behind, now.Add(-5*time.Minute + 2*time.Second)},
	} {
		msgs := []pg.AppendMsg{{Subject: "s"}, {Subject: "s"}}
		if _, _, err := w.db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, w.at.UnixNano()); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	ts := storedTimes(t, url, st.ID)
	if len(ts) != 12 {
		t.Fatalf("%d messages stored, want 12", len(ts))
	}
	for i := 1; i < len(ts); i++ {
		if ts[i] < ts[i-1] {
			t.Fatalf("sequence %d stored at %d, before sequence %d at %d", i+1, ts[i], i, ts[i-1])
		}
	}
	if last := time.Unix(0, ts[len(ts)-1]); !last.Equal(now.Add(2 * time.Millisecond)) {
		t.Fatalf("the last message stored at %v, want the latest time either replica gave, %v", last, now.Add(2*time.Millisecond))
	}
}

// storedTimes is the store times of a stream's messages, in the order of their sequences.
func storedTimes(t *testing.T, url string, streamID int64) []int64 {
	t.Helper()
	var ts []int64
	for _, s := range rawsql.Open(t, url).Strings(t, `SELECT ts::text FROM jetgres.msgs WHERE stream_id = $1 ORDER BY seq`, streamID) {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, v)
	}
	return ts
}

// The ownership session's confirmations keep measuring the offset, on the session's clock.
func TestConfirmMeasuresTheClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	clk := clocktest.At(time.Now().Add(-5 * time.Minute))
	own, err := db.OpenOwnership(ctx, clk, 10*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if err := own.Confirm(ctx); err != nil {
		t.Fatal(err)
	}
	off, ok := own.ClockOffset()
	if d := off - 5*time.Minute; !ok || d > 5*time.Second || d < -5*time.Second {
		t.Fatalf("confirmed with an offset of %v (%v), want PostgreSQL's clock five minutes ahead of one five minutes slow", off, ok)
	}
	if got := db.PGTime(clk.Now()); time.Since(got) > 5*time.Second || time.Since(got) < -5*time.Second {
		t.Fatalf("PGTime of the slow clock's now is %v, %v from now", got, time.Since(got))
	}
}
