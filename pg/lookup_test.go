package pg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jetgres/jetgres/pg"
)

// Gets by sequence and last by subject across many chunks, some opened by another replica
// since this one cached the chunk list, and after a delete and a purge.
func TestLookupsAcrossChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, st := twoReplicas(t)
	appendOn := func(db *pg.DB, subjects ...string) {
		t.Helper()
		for _, subj := range subjects {
			msgs := []pg.AppendMsg{{Subject: subj, Data: []byte(subj)}}
			if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 2, Msgs: msgs}}, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	last := func(db *pg.DB, subj string) uint64 {
		t.Helper()
		m, err := db.LastBySubject(ctx, st.ID, subj)
		if errors.Is(err, pg.ErrNotFound) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != m.Subject || (m.Subject != subj && subj != "s.*") {
			t.Fatalf("last of %s: %+v", subj, m)
		}
		return m.Seq
	}
	appendOn(a, "s.c", "s.a", "s.b", "s.a", "s.b", "s.d", "s.e") // 1..7 over four chunks
	for subj, want := range map[string]uint64{"s.c": 1, "s.a": 4, "s.b": 5, "s.e": 7, "s.zz": 0, "s.*": 7} {
		if got := last(a, subj); got != want {
			t.Errorf("last of %s: %d, want %d", subj, got, want)
		}
	}
	appendOn(b, "s.x", "s.a", "s.y", "s.z") // 8..11, chunks a has not seen
	if got := last(a, "s.a"); got != 9 {
		t.Errorf("last of s.a after another replica's appends: %d, want 9", got)
	}
	if m, err := a.GetMessage(ctx, st.ID, 11); err != nil || m.Subject != "s.z" {
		t.Errorf("get 11: %+v %v", m, err)
	}
	if err := a.DeleteMessage(ctx, st.ID, 9); err != nil {
		t.Fatal(err)
	}
	if _, err := a.GetMessage(ctx, st.ID, 9); !errors.Is(err, pg.ErrNotFound) {
		t.Errorf("get of a deleted message: %v", err)
	}
	if got := last(a, "s.a"); got != 4 {
		t.Errorf("last of s.a after its delete: %d, want 4", got)
	}
	if _, err := a.Purge(ctx, st.ID, pg.PurgeParams{UpTo: 5}); err != nil { // 1..4
		t.Fatal(err)
	}
	for _, seq := range []uint64{1, 4, 12, 0} {
		if _, err := a.GetMessage(ctx, st.ID, seq); !errors.Is(err, pg.ErrNotFound) {
			t.Errorf("get %d: %v, want not found", seq, err)
		}
	}
	for subj, want := range map[string]uint64{"s.c": 0, "s.a": 0, "s.b": 5, "s.e": 7} {
		if got := last(a, subj); got != want {
			t.Errorf("after the purge, last of %s: %d, want %d", subj, got, want)
		}
	}
}
