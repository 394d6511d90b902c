package pg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jetgres/jetgres/pg"
)

// Near the largest sequence: a purge just below it, a batch that runs past it (stored up to
// MaxSeq, refused after), reads of the last messages, and a purge beyond it refused.
func TestSequencesStopAtMaxSeq(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, st := twoReplicas(t)
	one := []pg.AppendMsg{{Subject: "s", Data: []byte("x")}}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: one}}, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{UpTo: pg.MaxSeq + 1}); !errors.Is(err, pg.ErrSeqRange) {
		t.Fatalf("purge beyond MaxSeq: %v, want ErrSeqRange", err)
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{UpTo: pg.MaxSeq - 1}); err != nil {
		t.Fatal(err)
	}
	msgs := []pg.AppendMsg{{Subject: "s.a", Data: []byte("1")}, {Subject: "s.b", Data: []byte("2")}, {Subject: "s.c", Data: []byte("3")}}
	res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	o := res[0].Outcomes
	if o[0].Seq != pg.MaxSeq-1 || o[1].Seq != pg.MaxSeq || !errors.Is(o[2].Err, pg.ErrSeqExhausted) || res[0].LastSeq != pg.MaxSeq {
		t.Fatalf("outcomes %+v, last %d", o, res[0].LastSeq)
	}
	// The fast path, too, must not take a sequence past MaxSeq.
	res, _, err = db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: one}}, 3)
	if err != nil || !errors.Is(res[0].Outcomes[0].Err, pg.ErrSeqExhausted) {
		t.Fatalf("append to a full stream: %+v %v", res, err)
	}
	state, err := db.State(ctx, st.ID)
	if err != nil || state.FirstSeq != pg.MaxSeq-1 || state.LastSeq != pg.MaxSeq || state.Msgs != 2 {
		t.Fatalf("state %+v %v", state, err)
	}
	m, err := db.GetMessage(ctx, st.ID, pg.MaxSeq)
	if err != nil || string(m.Data) != "2" {
		t.Fatalf("get MaxSeq: %+v %v", m, err)
	}
	if m, err := db.NextBySubject(ctx, st.ID, "s.*", pg.MaxSeq-1); err != nil || m.Seq != pg.MaxSeq-1 {
		t.Fatalf("next by subject: %+v %v", m, err)
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	state, err = db.State(ctx, st.ID)
	if err != nil || state.FirstSeq != pg.MaxSeq+1 || state.LastSeq != pg.MaxSeq || state.Msgs != 0 {
		t.Fatalf("state after purging everything %+v %v", state, err)
	}
}
