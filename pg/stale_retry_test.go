package pg_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// Backends terminated while their connections sit idle in the pool must not cost a publish:
// the first statement fails before anything reaches the server, and the call is retried once
// on a fresh connection.
func TestAppendAfterIdleBackendsTerminated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	const conns = 4
	db := pgtest.OpenWith(t, pg.Config{URL: url, MaxConns: conns})
	observer, err := pg.Open(ctx, pg.Config{URL: url, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(observer.Close)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}

	for round := range 3 {
		// Fill the pool, so that every connection it hands out next is one whose backend dies.
		var wg sync.WaitGroup
		for range conns {
			wg.Go(func() {
				if err := db.Background(ctx, func(ctx context.Context, q pg.Querier) error {
					_, err := q.Exec(ctx, `SELECT pg_sleep(0.1)`)
					return err
				}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		// The pids are listed first: a WHERE may evaluate its terms in any order.
		killed := count(t, observer, `SELECT count(*) FROM unnest(ARRAY(SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid())) AS p WHERE pg_terminate_backend(p, 5000)`)
		if killed != conns {
			t.Fatalf("round %d: terminated %d idle backends, want %d", round, killed, conns)
		}
		for i := range conns {
			res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "S", Data: []byte("x")}}}}, 1)
			if err != nil {
				t.Fatalf("round %d, publish %d after its backend was terminated: %v", round, i, err)
			}
			if len(res) != 1 || len(res[0].Outcomes) != 1 || res[0].Outcomes[0].Err != nil {
				t.Fatalf("round %d, publish %d: results %+v", round, i, res)
			}
		}
	}
	if n := db.Stats().StaleRetries; n == 0 {
		t.Fatal("no call was retried: the test did not reach a dead pooled connection")
	}
	state, err := db.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	if state.Msgs != 3*conns {
		t.Fatalf("stream holds %d messages, want %d: a retried publish was lost or doubled", state.Msgs, 3*conns)
	}
}
