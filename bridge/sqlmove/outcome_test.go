package sqlmove

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// A move whose COMMIT reached PostgreSQL and whose answer was lost with the connection is
// read back and announced as any move: the stream's readers hear of its messages, which are
// stored once, and the next move does not take them again.
func TestMoveCommitAnswerLost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	proxy := pgtest.NewProxy(t, url)
	db := pgtest.OpenAt(t, proxy.URL())
	raw := rawsql.Open(t, url)
	createStream(t, db, `{"name":"S","subjects":["s.>"]}`)
	h := newHost(t, db)
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		for _, d := range []string{"a", "b"} {
			if err := rawsql.Publish(ctx, q, "s.x", d, ""); err != nil {
				return err
			}
		}
		return nil
	})
	done := proxy.Arm(pgtest.CutAnswer, func(sql string) bool { return sql == "COMMIT" })
	m := startMover(t, db, h, prometheus.NewRegistry())
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy never cut the move's commit")
	}
	testwait.For(t, 30*time.Second, func() error {
		if got := h.announced("S"); !slices.Equal(got, []uint64{1, 2}) {
			return fmt.Errorf("commits announced %v to S, want 1 and 2", got)
		}
		return nil
	})
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error { return rawsql.Publish(ctx, q, "s.x", "c", "") })
	streamHolds(t, ctx, raw, "S", 3)
	if got := raw.Strings(t, `SELECT seq || ' ' || convert_from(data, 'UTF8') FROM jetgres.messages('S')`); !slices.Equal(got, []string{"1 a", "2 b", "3 c"}) {
		t.Fatalf("stream holds %v, want a, b and c once each", got)
	}
	if got := testutil.ToFloat64(m.m.moved); got != 3 {
		t.Errorf("moved %v, want 3", got)
	}
}
