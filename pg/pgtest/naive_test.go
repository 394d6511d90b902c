package pgtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
)

func openNaive(t *testing.T, url string) *Naive {
	t.Helper()
	q, err := OpenNaive(t.Context(), url, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	if err := q.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	return q
}

// TestNaiveDrainsWhatWasPublished publishes with Insert and Fill and checks that Drain,
// with workers competing for rows, deletes every row once and then finds none.
func TestNaiveDrainsWhatWasPublished(t *testing.T) {
	ctx := t.Context()
	q := openNaive(t, NewDB(t))
	if err := q.Insert(ctx, "naive.x", []byte("one")); err != nil {
		t.Fatal(err)
	}
	const filled = 2*fillPipeline + 499
	if err := q.Fill(ctx, "naive.x", make([]byte, 16), filled); err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int64
	if err := q.Drain(ctx, 3, 100, &acked); err != nil {
		t.Fatal(err)
	}
	if got := acked.Load(); got != filled+1 {
		t.Errorf("Drain acked %d rows, want %d", got, filled+1)
	}
	acked.Store(0)
	if err := q.Drain(ctx, 3, 100, &acked); err != nil || acked.Load() != 0 {
		t.Errorf("Drain of an empty queue: %d rows, err %v", acked.Load(), err)
	}
}

func TestNaiveResetEmptiesTheTable(t *testing.T) {
	ctx := t.Context()
	q := openNaive(t, NewDB(t))
	if err := q.Fill(ctx, "naive.x", []byte("x"), 10); err != nil {
		t.Fatal(err)
	}
	if err := q.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int64
	if err := q.Drain(ctx, 1, 100, &acked); err != nil || acked.Load() != 0 {
		t.Errorf("Drain after Reset: %d rows, err %v; want an empty table", acked.Load(), err)
	}
}

func TestNaiveDrainStopsOnError(t *testing.T) {
	q := openNaive(t, NewDB(t))
	if err := q.Fill(t.Context(), "naive.x", []byte("x"), 10); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var acked atomic.Int64
	if err := q.Drain(ctx, 2, 100, &acked); err == nil {
		t.Error("Drain with a cancelled context returned no error")
	}
}

func TestBareInsert(t *testing.T) {
	insert := BareInsert(t)
	for range 3 {
		if err := insert(t.Context(), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestProbe(t *testing.T) {
	ctx := t.Context()
	url := NewDB(t)
	openNaive(t, url)
	p, err := OpenProbe(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	if v, err := p.Setting(ctx, "server_version_num"); err != nil || len(v) < 6 {
		t.Errorf("Setting(server_version_num) = %q, %v", v, err)
	}
	if _, err := p.Setting(ctx, "jetgres.no_such_setting"); err == nil {
		t.Error("Setting of an unknown setting returned no error")
	}
	// The control file names the last checkpoint as soon as it completes; the statistics
	// views learn of it later.
	lastCheckpoint := func() string {
		var lsn string
		if err := p.pool.QueryRow(ctx, `SELECT checkpoint_lsn::text FROM pg_control_checkpoint()`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	before := lastCheckpoint()
	if err := p.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if after := lastCheckpoint(); after == before {
		t.Errorf("the last checkpoint is still at %s after Checkpoint", before)
	}

	// The statistics view lists a table as soon as it exists; its counts lag.
	st, err := p.TableStats(ctx, NaiveSchema, strings.ReplaceAll(NaiveTable, "_", `\_`))
	if err != nil || st.Tables != 1 || st.Bytes <= 0 {
		t.Errorf("TableStats of the naive table = %+v, %v; want one table with its index's bytes", st, err)
	}
	if st, err := p.TableStats(ctx, "public", "no_such_table"); err != nil || st != (TableStats{}) {
		t.Errorf("TableStats of no table = %+v, %v; want zeros", st, err)
	}

	holding := func() int {
		t.Helper()
		var n int
		if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction' AND backend_xmin IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	release, err := p.HoldSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := holding(); n != 1 {
		t.Errorf("%d sessions hold a snapshot while HoldSnapshot's is held, want 1", n)
	}
	// PostgreSQL reports the session idle before it answers the ROLLBACK, so no wait is needed.
	release()
	if n := holding(); n != 0 {
		t.Errorf("%d sessions hold a snapshot after release, want 0", n)
	}
}
