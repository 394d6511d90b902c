package pg_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// Reads go through a chunk in windows of sequences. Whatever the start, the batch size, the
// filter, the chunk boundaries, a run of tombstones or a purge that moved the first sequence
// into the middle of a chunk, a read returns the first live matching messages from its
// start, in order, and looks through to its end when it returns fewer than it may.
func TestReadsSkipTombstonesAndPurges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "W", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	const total, chunkRows = 400, 50 // chunks 0 to 7
	for i := 0; i < total; i += 40 {
		msgs := make([]pg.AppendMsg, 40)
		for j := range msgs {
			msgs[j] = pg.AppendMsg{Subject: fmt.Sprintf("w.%d", (i+j)%3), Data: []byte("x")}
		}
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: chunkRows, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	deleted := map[uint64]bool{}
	for seq := uint64(100); seq <= 220; seq++ {
		deleted[seq] = true
	}
	for _, seq := range []uint64{5, 33, 34, 301, 399} {
		deleted[seq] = true
	}
	for seq := range deleted {
		if err := db.DeleteMessage(ctx, st.ID, seq); err != nil {
			t.Fatal(err)
		}
	}
	// A purge into the middle of chunk 0, then one past chunks 0 to 2.
	for _, first := range []uint64{30, 180} {
		if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{UpTo: first}); err != nil {
			t.Fatal(err)
		}
		for _, filters := range [][]string{nil, {"w.1"}, {"w.0", "w.2"}} {
			var live []uint64
			for seq := first; seq <= total; seq++ {
				if subject := fmt.Sprintf("w.%d", (seq-1)%3); !deleted[seq] && (filters == nil || slices.Contains(filters, subject)) {
					live = append(live, seq)
				}
			}
			checkReads(t, db, st.ID, total, filters, live)
		}
	}
	// A byte bound cuts the read after whole messages, at least one.
	msgs, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: total, MaxMsgs: 100, MaxBytes: 1}, nil)
	if err != nil || len(msgs) != 1 || msgs[0].Seq != 221 || through != 221 {
		t.Fatalf("byte-bounded read: %d messages through %d: %v", len(msgs), through, err)
	}
	// A direct get's bound counts subject and data (4 bytes a message here) and keeps the message
	// that reaches it.
	msgs, through, _, err = db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: total, MaxMsgs: 100, MaxBytes: 10, BytesThrough: true}, nil)
	if err != nil || len(msgs) != 3 || msgs[2].Seq != 223 || through != 223 {
		t.Fatalf("direct get's byte-bounded read: %d messages through %d: %v", len(msgs), through, err)
	}
}

func checkReads(t *testing.T, db *pg.DB, stream int64, total uint64, filters []string, live []uint64) {
	t.Helper()
	for _, from := range []uint64{1, 29, 30, 33, 45, 50, 51, 99, 100, 150, 220, 221, 399, 400} {
		// However many messages a client asks for, a read ends: 1<<62 once overflowed the
		// window's size to zero, and the read went round for ever.
		for _, max := range []int{1, 7, 50, 1000, 1 << 62} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			msgs, through, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: stream, From: from, UpTo: total, MaxMsgs: max}, filters)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for _, m := range msgs {
				got = append(got, m.Seq)
			}
			i, _ := slices.BinarySearch(live, from)
			want := live[i:min(i+max, len(live))]
			wantThrough := total
			if len(want) == max {
				wantThrough = want[len(want)-1]
			}
			if !slices.Equal(got, want) || through != wantThrough {
				t.Fatalf("read %v from %d, at most %d: %v through %d, want %v through %d", filters, from, max, got, through, want, wantThrough)
			}
		}
	}
}
