package pg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// The two statements that commit an append: the general path's COMMIT, and the fast path's
// statement, which commits on its own as an implicit transaction.
var (
	isCommit    = func(sql string) bool { return sql == "COMMIT" }
	isFastWrite = func(sql string) bool { return strings.HasPrefix(sql, "WITH u AS (UPDATE jetgres.stream_state") }
)

// outcomeStream is a stream on a database reached through a proxy, with one message stored,
// so that its statements are prepared and this process knows its state.
func outcomeStream(t *testing.T) (*pg.DB, *pgtest.Proxy, int64) {
	t.Helper()
	proxy := pgtest.NewProxy(t, pgtest.NewDB(t))
	db := pgtest.OpenAt(t, proxy.URL())
	st, err := db.CreateStream(t.Context(), "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("first")}}}}, 1); err != nil {
		t.Fatal(err)
	}
	return db, proxy, st.ID
}

// cut appends bt while the proxy cuts the pipeline whose statement match accepts, and returns
// the error, which must say that the outcome is unknown.
func cut(t *testing.T, db *pg.DB, proxy *pgtest.Proxy, how pgtest.Cut, match func(string) bool, bt pg.AppendBatch, ts int64) *pg.OutcomeUnknownError {
	t.Helper()
	done := proxy.Arm(how, match)
	_, _, err := db.Append(t.Context(), []pg.AppendBatch{bt}, ts)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy never cut the connection")
	}
	ue, ok := errors.AsType[*pg.OutcomeUnknownError](err)
	if !ok || !errors.Is(err, pg.ErrOutcomeUnknown) {
		t.Fatalf("append whose commit got no answer: err = %v, want ErrOutcomeUnknown", err)
	}
	return ue
}

func expectState(t *testing.T, db *pg.DB, id int64, last, msgs uint64) {
	t.Helper()
	st, err := db.State(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.LastSeq != last || st.Msgs != msgs {
		t.Fatalf("stream holds %d messages up to %d, want %d up to %d", st.Msgs, st.LastSeq, msgs, last)
	}
}

func expectNext(t *testing.T, db *pg.DB, id int64, seq uint64) {
	t.Helper()
	res, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: id, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("next")}}}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := res[0].Outcomes[0]; got.Err != nil || got.Seq != seq {
		t.Fatalf("the next append: %+v, want sequence %d", got, seq)
	}
}

// A commit that reached the server, whose answer never came back, is not run again: Append
// says the outcome is unknown, and Resolve finds the batch stored, at the sequence the
// transaction gave it.
func TestAppendCommitAnswerLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		match func(string) bool
		msgID string // sends the append down the general path
	}{
		{"general path", isCommit, "id-1"},
		{"fast path", isFastWrite, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db, proxy, id := outcomeStream(t)
			bt := pg.AppendBatch{StreamID: id, DupWindow: time.Minute, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("second"), MsgID: tc.msgID}}}
			ue := cut(t, db, proxy, pgtest.CutAnswer, tc.match, bt, 2)
			expectState(t, db, id, 2, 2)
			if _, ok := db.RememberedLastSeq(id); ok {
				t.Fatal("the stream's state is still remembered after an append whose outcome is unknown")
			}
			r, err := db.Resolve(ctx, ue)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.NotStored) != 0 || len(r.Stored) != 1 {
				t.Fatalf("resolution %+v, want the batch stored", r)
			}
			res := r.Stored[0]
			if res.StreamID != id || res.LastSeq != 2 || len(res.Outcomes) != 1 || res.Outcomes[0].Seq != 2 || res.Outcomes[0].Err != nil ||
				len(res.Stored) != 1 || string(res.Stored[0].Data) != "second" {
				t.Fatalf("resolved result %+v, want the message stored at 2", res)
			}
			expectNext(t, db, id, 3)
			if tc.msgID != "" {
				again, _, err := db.Append(ctx, []pg.AppendBatch{bt}, 4)
				if err != nil {
					t.Fatal(err)
				}
				if o := again[0].Outcomes[0]; !o.Duplicate || o.Seq != 2 {
					t.Fatalf("retry with the same id: %+v, want a duplicate of 2", o)
				}
			}
		})
	}
}

// A commit that never reached the server leaves its session holding the transaction open,
// as a partitioned network does. Resolve ends that session, which rolls the transaction back,
// finds the batch not stored, and the stream takes the next append at once.
func TestAppendCommitRequestLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		match func(string) bool
		msgID string
	}{
		{"general path", isCommit, "id-1"},
		{"fast path", isFastWrite, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, proxy, id := outcomeStream(t)
			bt := pg.AppendBatch{StreamID: id, DupWindow: time.Minute, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("second"), MsgID: tc.msgID}}}
			ue := cut(t, db, proxy, pgtest.CutRequest, tc.match, bt, 2)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			r, err := db.Resolve(ctx, ue)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Stored) != 0 || len(r.NotStored) != 1 || r.NotStored[0] != id {
				t.Fatalf("resolution %+v, want the batch not stored", r)
			}
			expectState(t, db, id, 1, 1)
			expectNext(t, db, id, 2)
		})
	}
}

// The batches the fast path stored stay stored when the general path then fails in the
// same call: Append returns them with the error, so that their publishers hear the truth.
func TestAppendReturnsWhatTheFastPathStored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, proxy, fast := outcomeStream(t)
	st, err := db.CreateStream(ctx, "T", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	batches := []pg.AppendBatch{
		{StreamID: fast, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("fast")}}},
		{StreamID: st.ID, DupWindow: time.Minute, Msgs: []pg.AppendMsg{{Subject: "t", Data: []byte("general"), MsgID: "id-1"}}},
	}
	done := proxy.Arm(pgtest.CutAnswer, func(sql string) bool { return sql == "BEGIN" })
	res, _, err := db.Append(ctx, batches, 2)
	<-done
	if err == nil || errors.Is(err, pg.ErrOutcomeUnknown) {
		t.Fatalf("append whose general path lost its connection before the commit: err = %v, want a failure", err)
	}
	if len(res) != 1 || res[0].StreamID != fast || res[0].Outcomes[0].Seq != 2 {
		t.Fatalf("results %+v, want the fast path's batch stored at 2", res)
	}
	expectState(t, db, fast, 2, 2)
	expectState(t, db, st.ID, 0, 0)
}

// While the database is away Resolve cannot look, and says so with ErrOutcomeUnknown once
// its time is up; once the database is back, it finds the batch stored.
func TestResolveWhileTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	proxy := pgtest.NewProxy(t, pgtest.NewDB(t))
	db := pgtest.OpenWith(t, pg.Config{URL: proxy.URL(), StmtTimeout: time.Second})
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	bt := pg.AppendBatch{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("first")}}}
	ue := cut(t, db, proxy, pgtest.CutAll, isFastWrite, bt, 1)
	if r, err := db.Resolve(ctx, ue); !errors.Is(err, pg.ErrOutcomeUnknown) {
		t.Fatalf("resolving while the database is away: %+v, err = %v, want ErrOutcomeUnknown", r, err)
	}
	proxy.Restore()
	r, err := db.Resolve(ctx, ue)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Stored) != 1 || r.Stored[0].Outcomes[0].Seq != 1 {
		t.Fatalf("resolution once the database is back: %+v, want the batch stored at 1", r)
	}
}
