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

// TestKeyValuePutsStayCounted drives a key-value-like stream (a per-subject limit,
// discard new under max_bytes) through small batches of puts, which take the fast path
// with the stream's subject index, mixed with deletes, purges, expiry and chunk drops that
// change the stream behind the index's back. After every step it recounts what the stream
// holds from its rows and checks the per-subject limit, and at the end that most puts
// found an index.
func TestKeyValuePutsStayCounted(t *testing.T) {
	t.Parallel()
	for _, per := range []int64{1, 3} {
		t.Run(fmt.Sprint(per), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := pgtest.Open(t)
			st, err := db.CreateStream(ctx, "KV", []byte(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			lim := pg.Limits{MaxMsgsPer: per, MaxBytes: 1 << 20, DiscardNew: true}
			rng := rand.New(rand.NewPCG(uint64(per), 16))
			subjects := []string{"kv.a", "kv.b", "kv.c", "kv.d", "kv.e", "kv.f"}
			var last uint64
			puts, indexed := 0, 0
			for step := range 400 {
				var what string
				switch op := rng.IntN(40); {
				case op < 34:
					msgs := make([]pg.AppendMsg, 1+rng.IntN(4))
					for i := range msgs {
						msgs[i] = pg.AppendMsg{Subject: subjects[rng.IntN(len(subjects))], Data: make([]byte, rng.IntN(60))}
					}
					puts++
					if db.SubjectIndexed(st.ID) {
						indexed++
					}
					res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 7, Limits: lim, Msgs: msgs}}, time.Now().UnixNano())
					if err != nil {
						t.Fatalf("step %d: append: %v", step, err)
					}
					last = res[0].LastSeq
					what = fmt.Sprintf("append %d", len(msgs))
				case op < 36:
					seq := uint64(rng.IntN(int(last) + 2))
					_ = db.DeleteMessage(ctx, st.ID, seq)
					what = fmt.Sprintf("delete %d", seq)
				case op < 37:
					p := pg.PurgeParams{Filter: subjects[rng.IntN(len(subjects))]}
					if _, err := db.Purge(ctx, st.ID, p); err != nil {
						t.Fatalf("step %d: purge: %v", step, err)
					}
					what = "purge " + p.Filter
				case op < 38:
					if _, err := db.ExpireOlder(ctx, st.ID, time.Now().Add(-time.Duration(rng.IntN(50))*time.Millisecond).UnixNano()); err != nil {
						t.Fatalf("step %d: expire: %v", step, err)
					}
					what = "expire"
				case op < 39:
					if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{}); err != nil {
						t.Fatalf("step %d: purge all: %v", step, err)
					}
					what = "purge all"
				default:
					if _, err := db.DropChunks(ctx, st.ID, 0); err != nil {
						t.Fatalf("step %d: drop chunks: %v", step, err)
					}
					what = "drop chunks"
				}
				if err := db.CheckHoldings(ctx, st.ID); err != nil {
					t.Fatalf("step %d, after %s: %v", step, what, err)
				}
				live, err := db.LiveBySubject(ctx, st.ID, subjects)
				if err != nil {
					t.Fatal(err)
				}
				for s, n := range live {
					if int64(n) > per {
						t.Fatalf("step %d, after %s: %s holds %d messages, limit %d", step, what, s, n, per)
					}
				}
			}
			if indexed < puts*3/4 {
				t.Errorf("%d of %d puts found a subject index, want most", indexed, puts)
			}
		})
	}
}
