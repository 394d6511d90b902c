package pg_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// TestStreamInfoCountsSubjects drives a stream with many messages per subject over several
// chunks through appends, from this DB and from a second one on the same database (another
// replica), mixed with deletes, purges and expiry, and after every step checks the counts
// of a stream info (kept, extended, or recounted either way) against a grouped read of the
// rows, twice, so that the second reads the kept count.
func TestStreamInfoCountsSubjects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.NewDB(t)
	db, other := pgtest.OpenAt(t, url), pgtest.OpenAt(t, url)
	st, err := db.CreateStream(ctx, "SC", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(16, 16))
	subjects := []string{"sc.a", "sc.b", "sc.c", "sc.d", "sc.e", "sc.f", "sc.g", "sc.h"}
	var last uint64
	for step := range 300 {
		var what string
		switch op := rng.IntN(40); {
		case op < 30:
			writer := db
			if op >= 24 {
				writer = other
			}
			msgs := make([]pg.AppendMsg, 1+rng.IntN(40))
			for i := range msgs {
				msgs[i] = pg.AppendMsg{Subject: subjects[rng.IntN(len(subjects)-step/60)], Data: []byte("x")}
			}
			res, _, err := writer.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 1024, Msgs: msgs}}, time.Now().UnixNano())
			if err != nil {
				t.Fatalf("step %d: append: %v", step, err)
			}
			last = res[0].LastSeq
			what = fmt.Sprintf("append %d", len(msgs))
		case op < 34:
			seq := uint64(rng.IntN(int(last) + 2))
			_ = other.DeleteMessage(ctx, st.ID, seq)
			what = fmt.Sprintf("delete %d", seq)
		case op < 36:
			p := pg.PurgeParams{Filter: subjects[rng.IntN(len(subjects))], Keep: uint64(rng.IntN(3))}
			if _, err := other.Purge(ctx, st.ID, p); err != nil {
				t.Fatalf("step %d: purge: %v", step, err)
			}
			what = fmt.Sprintf("purge %s keep %d", p.Filter, p.Keep)
		case op < 38:
			p := pg.PurgeParams{UpTo: last - uint64(rng.IntN(100))}
			if _, err := db.Purge(ctx, st.ID, p); err != nil {
				t.Fatalf("step %d: purge: %v", step, err)
			}
			what = fmt.Sprintf("purge up to %d", p.UpTo)
		case op < 39:
			if _, err := other.ExpireOlder(ctx, st.ID, time.Now().Add(-time.Duration(rng.IntN(50))*time.Millisecond).UnixNano()); err != nil {
				t.Fatalf("step %d: expire: %v", step, err)
			}
			what = "expire"
		default:
			if _, err := other.Purge(ctx, st.ID, pg.PurgeParams{}); err != nil {
				t.Fatalf("step %d: purge all: %v", step, err)
			}
			what = "purge all"
		}
		totals, err := db.SubjectTotals(ctx, st.ID, ">")
		if err != nil {
			t.Fatal(err)
		}
		state, err := db.State(ctx, st.ID)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			info, err := db.StreamInfo(ctx, st.ID)
			if err != nil {
				t.Fatalf("step %d (%s): %v", step, what, err)
			}
			if info.NumSubjects != len(totals) || info.StreamState != state {
				t.Fatalf("step %d (%s): info %+v with %d subjects, rows %+v with %d", step, what, info.StreamState, info.NumSubjects, state, len(totals))
			}
		}
	}
}
