package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// sqlConsumeFilters are the four consumers' filters: orders.<k>.<n> goes to consumer Ck.
const sqlConsumeFilters = 4

// TestSQLConsumeExactlyOnce is issue 32's acceptance test for reading in SQL: 20 workers over
// 4 filtered consumers each take a batch with jetgres.next, write one application row per
// message, ack with jetgres.ack_through and then commit, roll back or get killed, while
// nats.go publishers publish and jetgres restarts once. Every stored message ends up with
// exactly one application row.
func TestSQLConsumeExactlyOnce(t *testing.T) {
	perPhase := 300
	if soak() {
		perPhase = 5000
	}
	dsn := testDatabase(t)
	j := startWithDatabase(t, dsn)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	_, js := j.connect(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	probe := openProbe(t, dsn, 4)
	for k := range sqlConsumeFilters {
		name := fmt.Sprintf("C%d", k)
		if _, err := js.CreateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
			FilterSubject: fmt.Sprintf("orders.%d.>", k)}); err != nil {
			t.Fatal(err)
		}
		if err := probe.Exec(ctx, `SELECT jetgres.read_in_sql('ORDERS', $1)`, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := probe.Exec(ctx, `CREATE TABLE processed (seq bigint NOT NULL, consumer text NOT NULL, subject text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	workers := rawsql.Open(t, dsn+" application_name=e2e-worker pool_max_conns=24")
	var stats sqlWorkerStats
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Go(func() {
			sqlWorker(ctx, t, workers, probe, fmt.Sprintf("C%d", w%sqlConsumeFilters), uint64(w), stop, &stats)
		})
	}
	publish := func(js jetstream.JetStream, phase int) {
		var pwg sync.WaitGroup
		for k := range sqlConsumeFilters {
			pwg.Go(func() {
				publishAllWithIDs(t, ctx, js, k, phase, perPhase)
			})
		}
		pwg.Wait()
	}
	publish(js, 0)
	j.stop(t)
	j = startWithDatabase(t, dsn)
	_, js = j.connect(t)
	publish(js, 1)

	want := sqlConsumeFilters * 2 * perPhase
	defer func() {
		if t.Failed() {
			t.Logf("consumers:\n%s\npending:\n%s\nunprocessed:\n%s",
				strings.Join(probe.Strings(t, `SELECT format('%s floor %s/%s handed %s attempt %s deliveries %s', c.name, c.ack_stream_seq, c.ack_consumer_seq, q.handed, q.attempt, q.deliveries) FROM jetgres.consumers c JOIN jetgres.sql_consumers q ON q.consumer_id = c.id ORDER BY c.name`), "\n"),
				strings.Join(probe.Strings(t, `SELECT format('%s %s %s %s %s', consumer_id, seq, delivered, acked, due) FROM jetgres.sql_pending ORDER BY consumer_id, seq`), "\n"),
				strings.Join(probe.Strings(t, `SELECT format('%s %s', m.seq, m.subject) FROM jetgres.messages('ORDERS') m WHERE NOT EXISTS (SELECT 1 FROM processed p WHERE p.seq = m.seq) ORDER BY m.seq`), "\n"))
		}
	}()
	testwait.For(t, time.Minute, func() error {
		var n int
		if err := probe.QueryRow(ctx, `SELECT count(*) FROM processed`).Scan(&n); err != nil {
			return err
		}
		if n < want {
			return fmt.Errorf("%d of %d messages processed", n, want)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	t.Logf("workers: %d commits, %d rollbacks, %d killed, %d refused while a replica served", stats.commits.Load(),
		stats.rollbacks.Load(), stats.killed.Load(), stats.served.Load())
	if stats.rollbacks.Load() == 0 || stats.killed.Load() == 0 {
		t.Error("no transaction was rolled back or killed: the test proves nothing")
	}

	var stored, distinct, rows, missing int
	if err := probe.QueryRow(ctx, `SELECT (SELECT count(*) FROM jetgres.messages('ORDERS')),
		(SELECT count(DISTINCT seq) FROM processed), (SELECT count(*) FROM processed),
		(SELECT count(*) FROM jetgres.messages('ORDERS') m WHERE NOT EXISTS (SELECT 1 FROM processed p WHERE p.seq = m.seq))`).
		Scan(&stored, &distinct, &rows, &missing); err != nil {
		t.Fatal(err)
	}
	if stored != want || rows != want || distinct != want || missing != 0 {
		t.Fatalf("%d messages stored, %d application rows for %d distinct messages, %d missing; want %d of each, none missing",
			stored, rows, distinct, missing, want)
	}
	for k := range sqlConsumeFilters {
		c, err := js.Consumer(ctx, "ORDERS", fmt.Sprintf("C%d", k))
		if err != nil {
			t.Fatal(err)
		}
		info := c.CachedInfo()
		if info.NumPending != 0 || info.NumAckPending != 0 || info.AckFloor.Consumer == 0 {
			t.Errorf("consumer C%d: num_pending %d, num_ack_pending %d, ack floor %+v: want everything acked",
				k, info.NumPending, info.NumAckPending, info.AckFloor)
		}
	}
}

// publishAllWithIDs publishes n messages to orders.<k>.<phase>-<i>, each with its own
// Nats-Msg-Id, and waits for every PubAck.
func publishAllWithIDs(t *testing.T, ctx context.Context, js jetstream.JetStream, k, phase, n int) {
	for i := range n {
		subj := fmt.Sprintf("orders.%d.%d-%d", k, phase, i)
		if _, err := js.Publish(ctx, subj, []byte(subj), jetstream.WithMsgID(subj)); err != nil {
			t.Errorf("publish %s: %v", subj, err)
			return
		}
	}
}

type sqlWorkerStats struct {
	commits, rollbacks, killed, served atomic.Int64
}

var errSQLRollback = errors.New("rolled back on purpose")

// sqlWorker processes batches of consumer until stop closes: one transaction per batch,
// which it commits, rolls back, or has killed by probe after acking.
func sqlWorker(ctx context.Context, t *testing.T, db, probe *rawsql.Pool, consumer string, seed uint64, stop <-chan struct{}, stats *sqlWorkerStats) {
	rnd := rand.New(rand.NewPCG(seed, 32))
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		fate := rnd.IntN(10)
		got := 0
		err := db.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			var pid int
			if err := q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			var last int64
			err := q.QueryRow(ctx, `WITH b AS (SELECT * FROM jetgres.next('ORDERS', $1, $2, $3)),
				ins AS (INSERT INTO processed (seq, consumer, subject) SELECT b.seq, $1, b.subject FROM b)
				SELECT count(*), coalesce(max(b.seq), 0) FROM b`, consumer, 1+rnd.IntN(40), rnd.IntN(2) == 0).Scan(&got, &last)
			if err != nil || got == 0 {
				return err
			}
			if err := q.Exec(ctx, `SELECT jetgres.ack_through('ORDERS', $1, $2)`, consumer, last); err != nil {
				return err
			}
			switch {
			case fate < 2:
				return errSQLRollback
			case fate < 3:
				if err := probe.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
					return err
				}
				stats.killed.Add(1)
			}
			return nil
		})
		switch {
		case err == nil && got > 0:
			stats.commits.Add(1)
		case err == nil:
			select {
			case <-stop:
			case <-time.After(10 * time.Millisecond): // nothing to do: a publisher is behind
			}
		case errors.Is(err, errSQLRollback):
			stats.rollbacks.Add(1)
		case strings.Contains(err.Error(), "JG012"):
			stats.served.Add(1)
		case fate == 2 || ctx.Err() != nil:
			// killed: the commit, or a statement after the kill, failed
		default:
			t.Errorf("worker on %s: %v", consumer, err)
			return
		}
	}
}
