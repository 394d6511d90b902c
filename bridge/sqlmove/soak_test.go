package sqlmove

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// The staging tables are reclaimed by rotation: once the publishing stops, both end empty
// and truncated, with every committed message in the stream. TestSQLPublishSoak runs the
// same over 1,000,000 messages.
func TestSQLPublishStagingRotates(t *testing.T) {
	t.Parallel()
	soakSQLPublish(t, 5_000)
}

// soakSQLPublish publishes total messages from SQL in transactions of 500, one in ten rolled
// back, while sampling how much the staging tables hold, and returns once the stream holds
// every committed message and the staging tables are empty.
func soakSQLPublish(t *testing.T, total int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	db, raw := sqlDB(t, `{"name":"S","subjects":["s.>"]}`)
	startMover(t, db, newHost(t, db), nil)
	const perTx, sessions = 500, 8
	var next, committed atomic.Int64
	var maxBytes atomic.Int64
	stagedBytes := func() int64 {
		var n int64
		_ = raw.QueryRow(ctx, `SELECT pg_total_relation_size('jetgres.staged_0') + pg_total_relation_size('jetgres.staged_1')`).Scan(&n)
		return n
	}
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			if n := stagedBytes(); n > maxBytes.Load() {
				maxBytes.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	defer sampler.Wait()
	defer close(done)
	started := time.Now()
	var wg sync.WaitGroup
	for range sessions {
		wg.Go(func() {
			for {
				tx := next.Add(1)
				if tx*perTx > int64(total) {
					return
				}
				commit := tx%10 != 0
				raw.AppTx(t, ctx, commit, func(q rawsql.Runner) error {
					return q.Exec(ctx, `SELECT jetgres.publish('s.x', g::text) FROM generate_series(1, $1) g`, perTx)
				})
				if commit {
					committed.Add(perTx)
				}
			}
		})
	}
	wg.Wait()
	// The last transaction rolls back: its rows are dead, and staging must shed them too.
	raw.AppTx(t, ctx, false, func(q rawsql.Runner) error {
		return q.Exec(ctx, `SELECT jetgres.publish('s.x', g::text) FROM generate_series(1, $1) g`, perTx)
	})
	published := time.Since(started)
	testwait.For(t, 10*time.Minute, func() error {
		var msgs int64
		if err := raw.QueryRow(ctx, `SELECT messages FROM jetgres.stream_list WHERE name = 'S'`).Scan(&msgs); err != nil {
			return err
		}
		if msgs != committed.Load() {
			return fmt.Errorf("stream holds %d of %d committed messages", msgs, committed.Load())
		}
		return nil
	})
	moved := time.Since(started)
	testwait.For(t, time.Minute, func() error {
		var rows, heap int64
		if err := raw.QueryRow(ctx, `SELECT (SELECT count(*) FROM jetgres.staged_0) + (SELECT count(*) FROM jetgres.staged_1),
			pg_relation_size('jetgres.staged_0') + pg_relation_size('jetgres.staged_1')`).Scan(&rows, &heap); err != nil {
			return err
		}
		if rows != 0 || heap != 0 {
			return fmt.Errorf("staging holds %d rows in %d bytes of heap", rows, heap)
		}
		return nil
	})
	t.Logf("%d messages (%d committed) published in %s, all moved after %s; staging peaked at %d kB and ended empty",
		total, committed.Load(), published.Round(time.Millisecond), moved.Round(time.Millisecond), maxBytes.Load()>>10)
}
