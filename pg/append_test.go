package pg_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
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

// Stats.Prepares counts the statements a connection prepares for the first time, and none
// that it already holds: on one connection, a second round of the same appends prepares
// nothing more.
func TestPreparesCountsFirstUseOnly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.OpenWith(t, pg.Config{URL: pgtest.NewDB(t), MaxConns: 1})
	st, err := db.CreateStream(ctx, "A", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOnce := func(id int64) {
		t.Helper()
		bt := pg.AppendBatch{StreamID: id, Msgs: []pg.AppendMsg{{Subject: "s.x", Data: []byte("x")}}}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{bt}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	// After two appends the stream's statements are prepared.
	appendOnce(st.ID)
	appendOnce(st.ID)
	first := db.Stats().Prepares
	if first == 0 {
		t.Fatal("no statement counted as prepared for a stream's first appends")
	}
	appendOnce(st.ID)
	appendOnce(st.ID)
	if n := db.Stats().Prepares - first; n != 0 {
		t.Errorf("%d statements counted as prepared for appends whose statements the connection holds", n)
	}
}

// A process knows a stream's state row from its creation, or from listing the streams after
// a start, so that the first publish takes the fast path; a row that moved since (another
// replica appended) still gets every sequence and count right.
func TestAppendStartsFromTheListedState(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	st, err := db.CreateStream(ctx, "A", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if last, ok := db.RememberedLastSeq(st.ID); !ok || last != 0 {
		t.Errorf("after creating the stream: remembered last sequence %d (%v), want 0", last, ok)
	}
	msg := []pg.AppendMsg{{Subject: "a", Data: []byte("0123456789")}}
	appendOne := func(db *pg.DB, want uint64) {
		t.Helper()
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msg}}, time.Now().UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		if got := res[0].Outcomes[0].Seq; got != want {
			t.Fatalf("stored at sequence %d, want %d", got, want)
		}
	}
	for seq := range uint64(3) {
		appendOne(db, seq+1)
	}

	// Another process, as after a restart or on another replica.
	other := pgtest.OpenAt(t, url)
	if _, ok := other.RememberedLastSeq(st.ID); ok {
		t.Fatal("a new process remembers a state it never read")
	}
	if _, err := other.Streams(ctx); err != nil {
		t.Fatal(err)
	}
	if last, ok := other.RememberedLastSeq(st.ID); !ok || last != 3 {
		t.Errorf("after listing the streams: remembered last sequence %d (%v), want 3", last, ok)
	}
	appendOne(other, 4)
	appendOne(db, 5) // db's memory is behind: the row moved
	appendOne(other, 6)
	state, err := db.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	size := pg.MessageSize(false, "a", nil, msg[0].Data)
	if state.LastSeq != 6 || state.Msgs != 6 || state.Bytes != 6*size {
		t.Errorf("state after 6 appends from two processes: last %d, %d msgs, %d bytes; want 6, 6, %d", state.LastSeq, state.Msgs, state.Bytes, 6*size)
	}
}

// A stream that another replica deleted while its publishes waited fails only its own
// publishes; the other streams of the transaction are stored, through the fast path's one
// statement and through the general path alike.
func TestAppendIsolatesADeletedStream(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db, other := pgtest.OpenAt(t, url), pgtest.OpenAt(t, url)
	for _, withID := range []bool{false, true} {
		var batches []pg.AppendBatch
		var ids []int64
		for _, name := range []string{"A", "B", "C"} {
			st, err := db.CreateStream(ctx, fmt.Sprintf("%s_%v", name, withID), []byte(`{"duplicate_window": 60000000000}`))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, st.ID)
			m := pg.AppendMsg{Subject: name, Data: []byte(name)}
			if withID {
				m.MsgID = name
			}
			batches = append(batches, pg.AppendBatch{StreamID: st.ID, DupWindow: time.Minute, Msgs: []pg.AppendMsg{m}})
		}
		if err := other.DeleteStream(ctx, ids[1]); err != nil {
			t.Fatal(err)
		}
		res, _, err := db.Append(ctx, batches, 1)
		if err != nil {
			t.Fatalf("message ids %v: append: %v", withID, err)
		}
		for _, r := range res {
			o := r.Outcomes[0]
			switch gone := r.StreamID == ids[1]; {
			case gone && (!r.Gone || !errors.Is(o.Err, pg.ErrNotFound)):
				t.Errorf("message ids %v: the deleted stream's outcome %+v, gone %v; want ErrNotFound", withID, o, r.Gone)
			case !gone && (r.Gone || o.Err != nil || o.Seq != 1):
				t.Errorf("message ids %v: stream %d's outcome %+v, gone %v; want stored at 1", withID, r.StreamID, o, r.Gone)
			}
		}
		if len(res) != 3 {
			t.Errorf("message ids %v: %d results, want 3", withID, len(res))
		}
	}
}

// The fast path locks the state rows of a flush in stream id order, as the general path
// does, whichever of its statements (the plain streams' one, a limited stream's own) moves
// each row: a flush whose limited stream has the lower id holds that row while it waits for
// the other, so that a transaction locking the two in id order waits behind it rather than
// deadlocking with it.
func TestFastPathLocksInStreamOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db, raw := pgtest.OpenAt(t, url), rawsql.Open(t, url)
	limited, err := db.CreateStream(ctx, "LIMITED", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := db.CreateStream(ctx, "PLAIN", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	lim := pg.Limits{MaxMsgsPer: 5}
	batches := func(i int) []pg.AppendBatch {
		return []pg.AppendBatch{
			{StreamID: limited.ID, Limits: lim, Msgs: []pg.AppendMsg{{Subject: fmt.Sprintf("k.%d", i), Data: []byte{1}}}},
			{StreamID: plain.ID, Msgs: []pg.AppendMsg{{Subject: "p", Data: []byte{1}}}},
		}
	}
	// The first flush loads the limited stream's subject index; the next takes the fast path.
	if _, _, err := db.Append(ctx, batches(0), 1); err != nil {
		t.Fatal(err)
	}
	release := raw.HoldRows(t, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, plain.ID)
	done := make(chan error, 1)
	go func() {
		_, _, err := db.Append(ctx, batches(1), 2)
		done <- err
	}()
	testwait.For(t, 10*time.Second, func() error {
		var waiting bool
		if err := raw.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)`).Scan(&waiting); err != nil || waiting {
			return err
		}
		return errors.New("the flush does not wait for the held row")
	})
	err = raw.Exec(ctx, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE NOWAIT`, limited.ID)
	release()
	if err == nil {
		t.Error("the flush waits for the higher stream without holding the lower one")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
