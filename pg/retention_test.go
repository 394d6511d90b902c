package pg_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// TestHoldingsStayCounted drives one stream through random appends (under per-subject and
// discard-old limits, with skipped no-interest publishes), deletes, purges, retention passes,
// expiry and chunk drops, on chunks of a few rows, and after every step recounts what the
// stream holds from its rows.
func TestHoldingsStayCounted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lim    pg.Limits
		config string
	}{
		{pg.Limits{}, `{}`},
		{pg.Limits{MaxMsgs: 40, MaxMsgsPer: 3}, `{}`},
		{pg.Limits{MaxBytes: 2000}, `{}`},
		{pg.Limits{MaxMsgs: 25, DiscardNew: true, MaxMsgsPer: 4}, `{}`},
		// A memory stream counts its bytes as nats-server's memory store does.
		{pg.Limits{MaxBytes: 1500, MaxMsgsPer: 3}, `{"storage":"memory"}`},
	} {
		lim := tc.lim
		t.Run(fmt.Sprintf("%+v %s", lim, tc.config), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := pgtest.Open(t)
			st, err := db.CreateStream(ctx, "R", []byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(lim.MaxMsgs), uint64(lim.MaxBytes)))
			subjects := []string{"r.a", "r.b", "r.c", "r.d.x"}
			var last uint64
			for step := range 300 {
				var what string
				switch op := rng.IntN(20); {
				case op < 12:
					n := 1 + rng.IntN(30)
					msgs := make([]pg.AppendMsg, n)
					for i := range msgs {
						msgs[i] = pg.AppendMsg{Subject: subjects[rng.IntN(len(subjects))], Data: make([]byte, rng.IntN(60)),
							NoInterest: rng.IntN(10) == 0}
						if rng.IntN(4) == 0 {
							msgs[i].Header = []byte("NATS/1.0\r\nA: b\r\n\r\n")
						}
					}
					res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 7, Limits: lim, Msgs: msgs}}, time.Now().UnixNano())
					if err != nil {
						t.Fatalf("step %d: append: %v", step, err)
					}
					last = res[0].LastSeq
					what = fmt.Sprintf("append %d", n)
				case op < 14:
					seq := uint64(rng.IntN(int(last) + 2))
					_ = db.DeleteMessage(ctx, st.ID, seq)
					what = fmt.Sprintf("delete %d", seq)
				case op < 15:
					p := pg.PurgeParams{}
					switch rng.IntN(4) {
					case 0:
						p.Filter = subjects[rng.IntN(len(subjects))]
					case 1:
						p.Filter, p.Keep = "r.*", uint64(rng.IntN(5))
					case 2:
						p.UpTo = last - uint64(rng.IntN(10)) + 1
					case 3:
						p.Keep = uint64(rng.IntN(20))
					}
					if _, err := db.Purge(ctx, st.ID, p); err != nil {
						t.Fatalf("step %d: purge %+v: %v", step, p, err)
					}
					what = fmt.Sprintf("purge %+v", p)
				case op < 17:
					p := pg.RetainParams{StreamID: st.ID, WorkQueue: rng.IntN(2) == 0, Consumers: []pg.RetainConsumer{
						{Floor: last - uint64(rng.IntN(15)), Filters: []string{"r.a", "r.b"}, Acked: []uint64{last - 1, last}},
						{Floor: last - uint64(rng.IntN(30)), Filters: []string{"r.d.>"}},
					}, Recheck: []pg.SeqRange{{From: 0, To: last}}}
					if _, err := db.Retain(ctx, p); err != nil {
						t.Fatalf("step %d: retain: %v", step, err)
					}
					what = "retain"
				case op < 18:
					if _, err := db.EnforceLimits(ctx, st.ID, pg.Limits{MaxMsgs: int64(20 + rng.IntN(20)), MaxMsgsPer: 2}); err != nil {
						t.Fatalf("step %d: enforce: %v", step, err)
					}
					what = "enforce"
				case op < 19:
					if _, err := db.ExpireOlder(ctx, st.ID, time.Now().Add(-time.Duration(rng.IntN(50))*time.Millisecond).UnixNano()); err != nil {
						t.Fatalf("step %d: expire: %v", step, err)
					}
					what = "expire"
				default:
					// The maintainer calls DropChunks only for the candidates: a stream
					// left out would keep a table it no longer reads.
					ids, err := db.ChunkDropCandidates(ctx, 0)
					if err != nil {
						t.Fatalf("step %d: chunk drop candidates: %v", step, err)
					}
					n, err := db.DropChunks(ctx, st.ID, 0)
					if err != nil {
						t.Fatalf("step %d: drop chunks: %v", step, err)
					}
					if candidate := slices.Contains(ids, st.ID); candidate != (n > 0) {
						t.Fatalf("step %d: the stream is a candidate: %v, yet DropChunks dropped %d tables", step, candidate, n)
					}
					what = fmt.Sprintf("drop chunks (%d)", n)
				}
				if err := db.CheckHoldings(ctx, st.ID); err != nil {
					t.Fatalf("step %d, after %s: %v", step, what, err)
				}
			}
		})
	}
}
