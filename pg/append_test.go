package pg_test

import (
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// Append takes its streams' locks in stream id order, but the caller's slice must come back
// as the caller built it: the bridge walks it again after the call.
func TestAppendLeavesTheCallersBatchesInOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	var batches []pg.AppendBatch
	for _, name := range []string{"A", "B", "C"} {
		st, err := db.CreateStream(ctx, name, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		// Newest stream first: the reverse of the order the locks are taken in.
		batches = append([]pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: name, Data: []byte(name)}}}}, batches...)
	}
	want := []int64{batches[0].StreamID, batches[1].StreamID, batches[2].StreamID}
	res, _, err := db.Append(ctx, batches, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range batches {
		if b.StreamID != want[i] {
			t.Fatalf("batch %d is stream %d after Append, want %d: the caller's slice was reordered", i, b.StreamID, want[i])
		}
	}
	if len(res) != len(batches) {
		t.Fatalf("%d results for %d batches", len(res), len(batches))
	}
	for _, r := range res {
		if len(r.Outcomes) != 1 || r.Outcomes[0].Seq != 1 {
			t.Errorf("stream %d: outcomes %+v, want one message stored at sequence 1", r.StreamID, r.Outcomes)
		}
	}
}
