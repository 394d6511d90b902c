package pg_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// An atomic batch refused by any of its messages stores nothing, and leaves its stream as
// it was for the next append, while the other streams of the same transaction are stored.
// Refusals come from an expectation, a duplicate inside the batch and a discard-new limit;
// once nothing refuses it, the batch is stored whole.
func TestAppendAtomicWholeOrNothing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	mk := func(name string) int64 {
		st, err := db.CreateStream(ctx, name, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		return st.ID
	}
	atomicID, plainID := mk("AT"), mk("PL")
	msgs := func(n int, bend func(i int, m *pg.AppendMsg)) []pg.AppendMsg {
		out := make([]pg.AppendMsg, n)
		for i := range out {
			out[i] = pg.AppendMsg{Subject: fmt.Sprintf("at.%d", i%3), Data: []byte("x")}
			if bend != nil {
				bend(i, &out[i])
			}
		}
		return out
	}
	seq := func(v uint64) *uint64 { return &v }
	appendBoth := func(what string, bt pg.AppendBatch) pg.AppendResult {
		t.Helper()
		bt.StreamID, bt.Atomic = atomicID, true
		res, _, err := db.Append(ctx, []pg.AppendBatch{bt, {StreamID: plainID, Msgs: msgs(1, nil)}}, 1)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var got pg.AppendResult
		for _, r := range res {
			if r.StreamID == plainID && (len(r.Outcomes) != 1 || r.Outcomes[0].Err != nil) {
				t.Fatalf("%s: the other stream's message: %+v", what, r.Outcomes)
			}
			if r.StreamID == atomicID {
				got = r
			}
		}
		return got
	}
	refused := func(what string, bt pg.AppendBatch, want error) {
		t.Helper()
		r := appendBoth(what, bt)
		for i, o := range r.Outcomes {
			if !errors.Is(o.Err, want) && fmt.Sprint(o.Err) != fmt.Sprint(want) {
				t.Fatalf("%s: message %d: %+v, want %v", what, i, o, want)
			}
		}
		if len(r.Stored) != 0 {
			t.Fatalf("%s: stored %d messages", what, len(r.Stored))
		}
		st, err := db.State(ctx, atomicID)
		if err != nil {
			t.Fatal(err)
		}
		if st.Msgs != 0 || st.LastSeq != 0 {
			t.Fatalf("%s: stream holds %d messages up to %d", what, st.Msgs, st.LastSeq)
		}
	}
	refused("wrong last sequence", pg.AppendBatch{Msgs: msgs(100, func(i int, m *pg.AppendMsg) {
		if i == 50 {
			m.ExpectLastSeq = seq(7)
		}
	})}, &pg.ExpectError{Kind: pg.ExpectLastSeqKind, LastSeq: 50})
	refused("last sequence after the first", pg.AppendBatch{Msgs: msgs(10, func(i int, m *pg.AppendMsg) {
		if i == 3 {
			m.ExpectLastSeq = seq(3)
		}
	})}, pg.ErrExpectInBatch)
	refused("duplicate inside", pg.AppendBatch{DupWindow: 1 << 40, Msgs: msgs(10, func(i int, m *pg.AppendMsg) {
		if i == 2 || i == 8 {
			m.MsgID = "twice"
		}
	})}, pg.ErrBatchDuplicate)
	refused("discard new", pg.AppendBatch{Limits: pg.Limits{MaxMsgs: 5, MaxBytes: -1, MaxMsgsPer: -1, DiscardNew: true}, Msgs: msgs(6, nil)},
		&pg.LimitError{Kind: pg.LimitMsgs})

	r := appendBoth("whole", pg.AppendBatch{DupWindow: 1 << 40, Msgs: msgs(100, func(i int, m *pg.AppendMsg) {
		m.MsgID = fmt.Sprint(i)
		if i == 0 {
			m.ExpectLastSeq = seq(0)
		}
	})})
	if len(r.Stored) != 100 || r.Outcomes[99].Seq != 100 {
		t.Fatalf("whole batch: stored %d, last outcome %+v", len(r.Stored), r.Outcomes[99])
	}
}
