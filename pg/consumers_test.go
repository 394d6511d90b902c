package pg_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func consumerTestStream(t *testing.T, ctx context.Context, db *pg.DB, subjects ...string) pg.StreamRow {
	t.Helper()
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]pg.AppendMsg, len(subjects))
	for i, s := range subjects {
		msgs[i] = pg.AppendMsg{Subject: s, Data: []byte(s)}
	}
	if len(msgs) > 0 {
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func TestConsumerRowsAndOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st := consumerTestStream(t, ctx, db)
	c, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(`{"a":1}`), AckStreamSeq: 4, Owner: "r1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.AckStreamSeq != 4 || c.Created.IsZero() {
		t.Fatalf("created %+v", c)
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(`{}`), Owner: "r1"}, 0); !errors.Is(err, pg.ErrExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID + 100, Name: "X", Config: []byte(`{}`)}, 0); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("create on a missing stream: %v", err)
	}
	// Held by r1: r2 cannot write its cursor.
	if _, err := db.WriteCursor(ctx, pg.CursorParams{StreamID: st.ID, Name: "C", Created: c.Created, Owner: "r2", AckStreamSeq: 9}); !errors.Is(err, pg.ErrNotOwner) {
		t.Fatalf("cursor write by a replica the row does not name: %v", err)
	}
	// A consumer of the same name created at another time is another consumer.
	if _, err := db.WriteCursor(ctx, pg.CursorParams{StreamID: st.ID, Name: "C", Created: c.Created.Add(-time.Microsecond), Owner: "r1", AckStreamSeq: 9}); !errors.Is(err, pg.ErrNotOwner) {
		t.Fatalf("cursor write of an earlier consumer of that name: %v", err)
	}
	if _, err := db.WriteCursor(ctx, pg.CursorParams{StreamID: st.ID, Name: "C", Created: c.Created, Owner: "r1", AckStreamSeq: 7, AckConsumerSeq: 3}); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetConsumer(ctx, st.ID, "C")
	if err != nil || got.AckStreamSeq != 7 || got.AckConsumerSeq != 3 {
		t.Fatalf("cursor %+v, %v", got, err)
	}
	if err := db.ClearOwner(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if row, prev, err := db.SetOwner(ctx, c.ID, "r2"); err != nil || prev != "" || row.Owner != "r2" || row.ID != c.ID {
		t.Fatalf("take released: %+v, previous %q, %v", row, prev, err)
	}
	if err := db.UpdateConsumerConfig(ctx, st.ID, "C", []byte(`{"b":2}`)); err != nil {
		t.Fatal(err)
	}
	list, err := db.Consumers(ctx, st.ID)
	if err != nil || len(list) != 1 || string(list[0].Config) != `{"b": 2}` {
		t.Fatalf("list %+v %v", list, err)
	}
	if err := db.DeleteConsumer(ctx, st.ID, "C"); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteConsumer(ctx, st.ID, "C"); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if _, _, err := db.SetOwner(ctx, c.ID, "r1"); !errors.Is(err, pg.ErrNotFound) {
		t.Fatalf("take deleted: %v", err)
	}
}

func TestConsumerReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st := consumerTestStream(t, ctx, db, "a.1", "b.1", "a.2", "c.1", "b.2", "a.1")
	msgs, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: 6, MaxMsgs: 10}, []string{"a.*", "c.>"})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
	}
	if !slices.Equal(seqs, []uint64{1, 3, 4, 6}) || through != 6 {
		t.Fatalf("filtered read %v through %d", seqs, through)
	}
	msgs, through, _, err = db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 2, UpTo: 6, MaxMsgs: 2}, nil)
	if err != nil || len(msgs) != 2 || through != 3 {
		t.Fatalf("bounded read %d msgs through %d: %v", len(msgs), through, err)
	}
	n, err := db.CountPending(ctx, pg.PendingParams{StreamID: st.ID, From: 2, UpTo: 6, Filters: []string{"b.*"}})
	if err != nil || n != 2 {
		t.Fatalf("count pending %d %v", n, err)
	}
	last, err := db.LastSeqsPerSubject(ctx, st.ID, []string{"a.*", "b.*"}, 6)
	if err != nil || !slices.Equal(last, []uint64{2, 3, 5, 6}) {
		t.Fatalf("last per subject %v %v", last, err)
	}
	hw, err := db.HighWater(ctx, []int64{st.ID, st.ID + 100})
	if err != nil || hw[st.ID] != 6 || len(hw) != 1 {
		t.Fatalf("high water %v %v", hw, err)
	}
	if err := db.DeleteMessage(ctx, st.ID, 3); err != nil {
		t.Fatal(err)
	}
	if n, _ := db.CountPending(ctx, pg.PendingParams{StreamID: st.ID, From: 1, UpTo: 6, Filters: []string{"a.*"}}); n != 2 {
		t.Fatalf("count after delete %d", n)
	}
	seq, err := db.SeqAtTime(ctx, st.ID, time.Now().Add(time.Hour).UnixNano())
	if err != nil || seq != 7 {
		t.Fatalf("seq at future time %d %v", seq, err)
	}
	seq, err = db.SeqAtTime(ctx, st.ID, 0)
	if err != nil || seq != 1 {
		t.Fatalf("seq at time zero %d %v", seq, err)
	}
}
