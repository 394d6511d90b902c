package pgtest

import (
	"context"
	"strings"
	"testing"
)

// TestStoreFloor stores batches and checks their sequences and rows, that a failed batch
// takes no sequence, that commits wait for the WAL flush although the test cluster's default
// does not, and that Close drops the table.
func TestStoreFloor(t *testing.T) {
	ctx := t.Context()
	url := NewDB(t)
	f, err := OpenStoreFloor(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = f.Close(context.Background())
		}
	})

	var mode string
	if err := f.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&mode); err != nil || mode != "on" {
		t.Errorf("synchronous_commit = %q, %v; want on", mode, err)
	}

	batch := []FloorMsg{{"floor.a", []byte("one")}, {"floor.b", []byte("two")}, {"floor.a", []byte("three")}}
	if first, err := f.Store(ctx, batch); err != nil || first != 1 {
		t.Fatalf("first Store = %d, %v; want 1", first, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.Store(cancelled, batch[:1]); err == nil {
		t.Error("Store with a cancelled context returned no error")
	}
	if first, err := f.Store(ctx, batch[1:]); err != nil || first != 4 {
		t.Fatalf("Store after a failed one = %d, %v; want 4", first, err)
	}

	rows, err := f.pool.Query(ctx, `SELECT seq, subject, data FROM `+storeFloorTable+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	want := append(batch[:3:3], batch[1:]...)
	n := 0
	for rows.Next() {
		var seq int64
		var m FloorMsg
		if err := rows.Scan(&seq, &m.Subject, &m.Data); err != nil {
			t.Fatal(err)
		}
		if n < len(want) && (seq != int64(n+1) || m.Subject != want[n].Subject || string(m.Data) != string(want[n].Data)) {
			t.Errorf("row %d: seq %d, %s %q; want seq %d, %s %q", n, seq, m.Subject, m.Data, n+1, want[n].Subject, want[n].Data)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != len(want) {
		t.Errorf("%d rows, %v; want %d", n, err, len(want))
	}

	p, err := OpenProbe(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	tables := func() int {
		t.Helper()
		st, err := p.TableStats(ctx, StoreFloorSchema, strings.ReplaceAll(StoreFloorTable, "_", `\_`))
		if err != nil {
			t.Fatal(err)
		}
		return st.Tables
	}
	if n := tables(); n != 1 {
		t.Errorf("before Close, %d tables; want the floor's", n)
	}
	closed = true
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := tables(); n != 0 {
		t.Errorf("after Close, %d tables; want none", n)
	}
}
