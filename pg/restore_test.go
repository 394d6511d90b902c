package pg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// A restore keeps sequences and times across chunks, leaves the skipped sequences deleted
// and counted as such, raises the last sequence over deleted ones at the end, tells where
// each batch left the stream, and the stream's next publish follows on from there.
func TestRestoreMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pg.Open(ctx, pg.Config{URL: pgtest.NewDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := db.CreateStreamFrom(ctx, "R", []byte(`{}`), 5)
	if err != nil {
		t.Fatal(err)
	}
	// Sequences 5..40, every third one deleted, in two batches over chunks of 7 rows.
	var want []pg.Message
	for seq := uint64(5); seq <= 40; seq++ {
		if seq%3 == 0 {
			continue
		}
		m := pg.Message{Seq: seq, TS: int64(seq) * 1000, Subject: fmt.Sprint("r.", seq%4), Data: []byte(fmt.Sprint(seq))}
		if seq%5 == 0 {
			m.Header = []byte("NATS/1.0\r\nK: v\r\n\r\n")
		}
		want = append(want, m)
	}
	half := len(want) / 2
	if err := db.RestoreMessages(ctx, pg.RestoreParams{StreamID: st.ID, Msgs: append([]pg.Message{}, want[:half]...), ChunkRows: 7}); err != nil {
		t.Fatal(err)
	}
	left, err := db.RestoreBatch(ctx, pg.RestoreParams{StreamID: st.ID, Msgs: append([]pg.Message{}, want[half:]...), Through: 44, ChunkRows: 7})
	if err != nil {
		t.Fatal(err)
	}
	if w := (pg.RestoreResult{Prev: want[half-1].Seq, First: 5, Last: 44}); left != w {
		t.Fatalf("the second batch left the stream at %+v, want %+v", left, w)
	}
	err = db.RestoreMessages(ctx, pg.RestoreParams{StreamID: st.ID, Msgs: []pg.Message{{Seq: 44, Subject: "r.x"}}})
	if !errors.Is(err, pg.ErrRestoreOrder) {
		t.Fatalf("a message at the last sequence: %v, want ErrRestoreOrder", err)
	}

	got, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: 44, MaxMsgs: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d messages, want %d", len(got), len(want))
	}
	var bytes uint64
	for i, m := range got {
		w := want[i]
		if m.Seq != w.Seq || m.TS != w.TS || m.Subject != w.Subject || string(m.Header) != string(w.Header) || string(m.Data) != string(w.Data) {
			t.Fatalf("message %d: got %+v, want %+v", i, m, w)
		}
		bytes += m.Size()
	}
	state, err := db.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	if state.FirstSeq != 5 || state.LastSeq != 44 || state.Msgs != uint64(len(want)) || state.Bytes != bytes ||
		state.Deleted != 40-uint64(len(want)) || state.FirstTS != 5000 || state.LastTS != 40_000 {
		t.Fatalf("state %+v", state)
	}
	gone, err := db.GoneSeqs(ctx, st.ID, []uint64{6, 7, 42})
	if err != nil || len(gone) != 2 || gone[0] != 6 || gone[1] != 42 {
		t.Fatalf("gone sequences %v, %v; want [6 42]", gone, err)
	}

	res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 7, Msgs: []pg.AppendMsg{{Subject: "r.new", Data: []byte("n")}}}}, 50_000)
	if err != nil {
		t.Fatal(err)
	}
	if o := res[0].Outcomes[0]; o.Err != nil || o.Seq != 45 {
		t.Fatalf("the publish after the restore: %+v", o)
	}
}
