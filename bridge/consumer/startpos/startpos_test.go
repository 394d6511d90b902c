package startpos_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/readahead"
	"github.com/jetgres/jetgres/bridge/consumer/startpos"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// appendAt stores messages on subjects, all stamped ts.
func appendAt(t *testing.T, db *pg.DB, streamID int64, ts time.Time, subjects ...string) {
	t.Helper()
	msgs := make([]pg.AppendMsg, len(subjects))
	for i, s := range subjects {
		msgs[i] = pg.AppendMsg{Subject: s, Data: []byte(s)}
	}
	if _, _, err := db.Append(context.Background(), []pg.AppendBatch{{StreamID: streamID, Msgs: msgs}}, ts.UnixNano()); err != nil {
		t.Fatal(err)
	}
}

// Each deliver policy starts where nats-server's selectStartingSeqNo starts it, against
// what PostgreSQL holds.
func TestChooseByDeliverPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	empty, err := startpos.Choose(ctx, db, st.ID, &server.ConsumerConfig{DeliverPolicy: server.DeliverNew})
	if err != nil || empty.Next != 1 {
		t.Fatalf("new on an empty stream: %+v, %v; want next 1", empty, err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	appendAt(t, db, st.ID, t0, "a", "b", "a")
	appendAt(t, db, st.ID, t0.Add(time.Minute), "c", "b")

	startAt := t0.Add(time.Minute)
	for _, tc := range []struct {
		name string
		cfg  server.ConsumerConfig
		next uint64
		skip []uint64
	}{
		{"all", server.ConsumerConfig{DeliverPolicy: server.DeliverAll}, 1, nil},
		{"last", server.ConsumerConfig{DeliverPolicy: server.DeliverLast}, 5, nil},
		{"last of a", server.ConsumerConfig{DeliverPolicy: server.DeliverLast, FilterSubject: "a"}, 3, nil},
		{"last of nothing", server.ConsumerConfig{DeliverPolicy: server.DeliverLast, FilterSubject: "z"}, 6, nil},
		{"last per subject", server.ConsumerConfig{DeliverPolicy: server.DeliverLastPerSubject}, 3, []uint64{3, 4, 5}},
		{"by start sequence", server.ConsumerConfig{DeliverPolicy: server.DeliverByStartSequence, OptStartSeq: 4}, 4, nil},
		{"by start time", server.ConsumerConfig{DeliverPolicy: server.DeliverByStartTime, OptStartTime: &startAt}, 4, nil},
		{"new", server.ConsumerConfig{DeliverPolicy: server.DeliverNew}, 6, nil},
	} {
		pos, err := startpos.Choose(ctx, db, st.ID, &tc.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if pos.Next != tc.next || !slices.Equal(pos.Skip, tc.skip) {
			t.Fatalf("%s: next %d, skip %v; want %d, %v", tc.name, pos.Next, pos.Skip, tc.next, tc.skip)
		}
		if tc.skip != nil && pos.Resume != 5 {
			t.Fatalf("%s: resumes after %d, want 5", tc.name, pos.Resume)
		}
	}
}

// The batch after the one read starts at the first listed sequence past what that read
// looked through, wherever its count cut it, and its read is handed over only where the
// list then starts.
func TestPositionFollowingBatch(t *testing.T) {
	p := &startpos.Position{Skip: []uint64{2, 4, 6, 8, 10, 12}, Resume: 12}
	if _, _, ok := p.Following(2); ok {
		t.Fatal("a following batch before any was read")
	}
	from, upTo := p.NextBatch(2)
	if from != 2 || upTo != 4 {
		t.Fatalf("first batch %d-%d, want 2-4", from, upTo)
	}
	// The read took 2 and 4 and looked through 5.
	p.SetBatch([]pg.Message{{Seq: 2}, {Seq: 4}}, 5)
	from, upTo, ok := p.Following(2)
	if !ok || from != 6 || upTo != 8 {
		t.Fatalf("following batch %d-%d %v, want 6-8", from, upTo, ok)
	}
	r := readahead.NewRead(from, upTo)
	p.SetAhead(r)
	if _, _, ok := p.Following(2); ok {
		t.Fatal("a second following batch while one is read")
	}
	if p.TakeAhead() != nil {
		t.Fatal("the following read handed over while the list starts before it")
	}
	p.SetAhead(r)
	p.Skip = p.Skip[2:]
	if p.TakeAhead() != r {
		t.Fatal("the following read not handed over where the list starts")
	}
	p.SetBatch([]pg.Message{{Seq: 6}, {Seq: 8}, {Seq: 10}}, 11)
	if from, upTo, ok := p.Following(5); !ok || from != 12 || upTo != 12 {
		t.Fatalf("last batch %d-%d %v, want 12-12", from, upTo, ok)
	}
	p.SetBatch([]pg.Message{{Seq: 12}}, 12)
	if _, _, ok := p.Following(5); ok {
		t.Fatal("a following batch past the list")
	}
	p.SetAhead(r)
	p.DropBatch()
	if p.TakeAhead() != nil {
		t.Fatal("the following read kept past DropBatch")
	}
}
