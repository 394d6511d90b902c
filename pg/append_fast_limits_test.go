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

// TestFastPathUnderLimits drives streams with max_msgs and max_bytes, discard new and old,
// through small batches, which take the fast path while they stay within the limits, mixed
// with deletes and expiry that lower the counts behind its back. After every step the
// stream's counts must equal its rows and stay within the limits, and a batch that fits
// must be stored whole.
func TestFastPathUnderLimits(t *testing.T) {
	t.Parallel()
	for _, discardNew := range []bool{true, false} {
		t.Run(fmt.Sprintf("discard new %v", discardNew), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			db := pgtest.Open(t)
			st, err := db.CreateStream(ctx, "LIM", []byte(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			lim := pg.Limits{MaxMsgs: 20, MaxBytes: 1500, DiscardNew: discardNew}
			rng := rand.New(rand.NewPCG(7, 16))
			var last uint64
			for step := range 300 {
				before, err := db.State(ctx, st.ID)
				if err != nil {
					t.Fatal(err)
				}
				var what string
				switch op := rng.IntN(20); {
				case op < 17:
					msgs := make([]pg.AppendMsg, 1+rng.IntN(4))
					for i := range msgs {
						msgs[i] = pg.AppendMsg{Subject: "lim.x", Data: make([]byte, rng.IntN(50))}
					}
					res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 9, Limits: lim, Msgs: msgs}}, time.Now().UnixNano())
					if err != nil {
						t.Fatalf("step %d: append: %v", step, err)
					}
					var size uint64
					for _, m := range msgs {
						size += pg.MessageSize(false, m.Subject, m.Header, m.Data)
					}
					fits := before.Msgs+uint64(len(msgs)) <= uint64(lim.MaxMsgs) && before.Bytes+size <= uint64(lim.MaxBytes)
					for i, o := range res[0].Outcomes {
						if o.Err != nil && (fits || !discardNew) {
							t.Fatalf("step %d: message %d of %d refused (%v) with %d msgs, %d bytes held", step, i, len(msgs), o.Err, before.Msgs, before.Bytes)
						}
					}
					last = res[0].LastSeq
					what = fmt.Sprintf("append %d", len(msgs))
				case op < 19:
					seq := uint64(rng.IntN(int(last) + 2))
					_ = db.DeleteMessage(ctx, st.ID, seq)
					what = fmt.Sprintf("delete %d", seq)
				default:
					if _, err := db.ExpireOlder(ctx, st.ID, time.Now().Add(-time.Duration(rng.IntN(30))*time.Millisecond).UnixNano()); err != nil {
						t.Fatalf("step %d: expire: %v", step, err)
					}
					what = "expire"
				}
				if err := db.CheckHoldings(ctx, st.ID); err != nil {
					t.Fatalf("step %d, after %s: %v", step, what, err)
				}
				after, err := db.State(ctx, st.ID)
				if err != nil {
					t.Fatal(err)
				}
				if after.Msgs > uint64(lim.MaxMsgs) || after.Bytes > uint64(lim.MaxBytes) {
					t.Fatalf("step %d (%s): %d msgs, %d bytes past the limits", step, what, after.Msgs, after.Bytes)
				}
			}
		})
	}
}
