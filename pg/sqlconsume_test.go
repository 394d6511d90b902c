package pg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// sqlConsumer makes a stream ORDERS with n messages (orders.<i%2>.<i>) and a consumer of it
// with config (JSON), switched to SQL; it returns the raw pool to call the functions with.
func sqlConsumer(t *testing.T, config string, n int) (url string, db *pg.DB, raw *rawsql.Pool) {
	t.Helper()
	ctx := t.Context()
	url = pgtest.NewDB(t)
	db = pgtest.OpenAt(t, url)
	raw = rawsql.Open(t, url)
	st, err := db.CreateStream(ctx, "ORDERS", []byte(`{"name":"ORDERS","subjects":["orders.>"]}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOrders(t, db, st.ID, 0, n)
	if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(config)}, 0); err != nil {
		t.Fatal(err)
	}
	if err := raw.Exec(ctx, `SELECT jetgres.read_in_sql('ORDERS', 'C')`); err != nil {
		t.Fatal(err)
	}
	return url, db, raw
}

func appendOrders(t *testing.T, db *pg.DB, streamID int64, from, n int) {
	t.Helper()
	var msgs []pg.AppendMsg
	for i := from; i < from+n; i++ {
		msgs = append(msgs, pg.AppendMsg{Subject: fmt.Sprintf("orders.%d.%d", i%2, i), Data: []byte(fmt.Sprint(i))})
	}
	if _, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: streamID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
}

// delivery is one row jetgres.next returned.
type delivery struct {
	seq       int64
	subject   string
	delivered int
}

func next(ctx context.Context, q rawsql.Runner, max int, nowait bool) ([]delivery, error) {
	rows, err := q.Query(ctx, `SELECT seq, subject, delivered FROM jetgres.next('ORDERS', 'C', $1, $2)`, max, nowait)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []delivery
	for rows.Next() {
		var d delivery
		if err := rows.Scan(&d.seq, &d.subject, &d.delivered); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

var errRollback = errors.New("rollback")

// attempt runs fn in a transaction and commits it, or rolls it back when commit is false.
func attempt(t *testing.T, raw *rawsql.Pool, commit bool, fn func(ctx context.Context, q rawsql.Runner) error) {
	t.Helper()
	err := raw.Tx(t.Context(), func(ctx context.Context, q rawsql.Runner) error {
		if err := fn(ctx, q); err != nil {
			return err
		}
		if !commit {
			return errRollback
		}
		return nil
	})
	if err != nil && !(errors.Is(err, errRollback) && !commit) {
		t.Fatal(err)
	}
}

func seqs(ds []delivery) (out []int64) {
	for _, d := range ds {
		out = append(out, d.seq)
	}
	return out
}

func counts(ds []delivery) (out []int) {
	for _, d := range ds {
		out = append(out, d.delivered)
	}
	return out
}

func floor(t *testing.T, raw *rawsql.Pool) (stream, consumer int64) {
	t.Helper()
	if err := raw.QueryRow(t.Context(), `SELECT ack_stream_seq, ack_consumer_seq FROM jetgres.consumers WHERE name = 'C'`).Scan(&stream, &consumer); err != nil {
		t.Fatal(err)
	}
	return stream, consumer
}

func TestSQLConsumeAckTakesEffectAtCommit(t *testing.T) {
	t.Parallel()
	_, _, raw := sqlConsumer(t, `{"durable_name":"C","ack_policy":"explicit","filter_subject":"orders.1.>"}`, 10)
	var got []delivery
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		var err error
		if got, err = next(ctx, q, 3, false); err != nil {
			return err
		}
		more, err := next(ctx, q, 1, false)
		got = append(got, more...)
		if err != nil {
			return err
		}
		return q.Exec(ctx, `SELECT jetgres.ack_through('ORDERS', 'C', $1)`, got[len(got)-1].seq)
	})
	if want := []int64{2, 4, 6, 8}; fmt.Sprint(seqs(got)) != fmt.Sprint(want) {
		t.Fatalf("first transaction got %v, want %v", seqs(got), want)
	}
	if s, c := floor(t, raw); s != 8 || c != 4 {
		t.Fatalf("ack floor %d/%d, want 8/4", s, c)
	}
	// A rollback leaves the floor where it was and counts a delivery.
	attempt(t, raw, false, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 5, false)
		if err == nil && fmt.Sprint(seqs(ds)) != "[10]" {
			err = fmt.Errorf("got %v, want [10]", seqs(ds))
		}
		if err == nil {
			err = q.Exec(ctx, `SELECT jetgres.ack_through('ORDERS', 'C', 10)`)
		}
		return err
	})
	if s, _ := floor(t, raw); s != 8 {
		t.Fatalf("ack floor %d after a rollback, want 8", s)
	}
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 5, false)
		if err == nil && (fmt.Sprint(seqs(ds)) != "[10]" || fmt.Sprint(counts(ds)) != "[2]") {
			err = fmt.Errorf("got %v delivered %v, want [10] delivered [2]", seqs(ds), counts(ds))
		}
		if err == nil {
			err = q.Exec(ctx, `SELECT jetgres.ack('ORDERS', 'C', 10)`)
		}
		return err
	})
	if s, c := floor(t, raw); s != 10 || c != 6 {
		t.Fatalf("ack floor %d/%d, want 10/6", s, c)
	}
}

func TestSQLConsumeRedeliversAfterKill(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, _, raw := sqlConsumer(t, `{"durable_name":"C","ack_policy":"explicit","max_deliver":3}`, 4)
	for i := range 2 {
		attempt(t, raw, false, func(ctx context.Context, q rawsql.Runner) error {
			ds, err := next(ctx, q, 2, false)
			if err == nil && fmt.Sprint(counts(ds)) != fmt.Sprint([]int{i + 1, i + 1}) {
				err = fmt.Errorf("attempt %d got %v delivered %v", i+1, seqs(ds), counts(ds))
			}
			return err
		})
	}
	// A session killed in the middle of its transaction.
	killed := rawsql.Open(t, url)
	err := killed.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
		if _, err := next(ctx, q, 2, false); err != nil {
			return err
		}
		return q.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
	})
	if err == nil {
		t.Fatal("the killed session's transaction did not fail")
	}
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 10, false)
		// 1 and 2 went to three transactions that failed: max_deliver holds them back.
		if err == nil && (fmt.Sprint(seqs(ds)) != "[3 4]" || fmt.Sprint(counts(ds)) != "[1 1]") {
			err = fmt.Errorf("got %v delivered %v, want [3 4] delivered [1 1]", seqs(ds), counts(ds))
		}
		return err
	})
}

func TestSQLConsumeOneTransactionAtATime(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlConsumer(t, `{"durable_name":"C","ack_policy":"explicit"}`, 4)
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			ds, err := next(ctx, q, 2, false)
			if err != nil {
				return err
			}
			close(held)
			<-release
			return q.Exec(ctx, `SELECT jetgres.ack_through('ORDERS', 'C', $1)`, ds[len(ds)-1].seq)
		})
	}()
	<-held
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 2, true)
		if err == nil && len(ds) != 0 {
			err = fmt.Errorf("nowait got %v while another transaction holds the consumer", seqs(ds))
		}
		return err
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 10, true)
		if err == nil && fmt.Sprint(seqs(ds)) != "[3 4]" {
			err = fmt.Errorf("got %v, want [3 4]", seqs(ds))
		}
		return err
	})
}

func TestSQLConsumeAckThroughLeavesWhatItDidNotSee(t *testing.T) {
	t.Parallel()
	_, _, raw := sqlConsumer(t, `{"durable_name":"C","ack_policy":"explicit","ack_wait":3600000000000}`, 4)
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		_, err := next(ctx, q, 2, false) // committed, not acked: due again in an hour
		return err
	})
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 10, false)
		if err == nil && fmt.Sprint(seqs(ds)) != "[3 4]" {
			err = fmt.Errorf("got %v, want [3 4]", seqs(ds))
		}
		if err == nil {
			err = q.Exec(ctx, `SELECT jetgres.ack_through('ORDERS', 'C', 4)`)
		}
		return err
	})
	if s, _ := floor(t, raw); s != 0 {
		t.Fatalf("ack floor %d: ack_through acked messages its transaction never received", s)
	}
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		if err := q.Exec(ctx, `SELECT jetgres.ack('ORDERS', 'C', 2)`); err != nil {
			return err
		}
		return q.Exec(ctx, `SELECT jetgres.ack('ORDERS', 'C', 1)`)
	})
	if s, c := floor(t, raw); s != 4 || c != 4 {
		t.Fatalf("ack floor %d/%d, want 4/4", s, c)
	}
}

func TestSQLConsumeExcludesReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	st, err := db.CreateStream(ctx, "ORDERS", []byte(`{"name":"ORDERS","subjects":["orders.>"]}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOrders(t, db, st.ID, 0, 2)
	own, err := db.OpenOwnership(ctx, nil, time.Minute, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	key := pg.ConsumerKey{StreamID: st.ID, Name: "C"}
	id, err := own.LockNew(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{ID: id, StreamID: st.ID, Name: "C", Config: []byte(`{"ack_policy":"explicit"}`), Owner: "r1"}, 0); err != nil {
		t.Fatal(err)
	}
	_, err = next(ctx, raw, 1, false)
	if err == nil || !strings.Contains(err.Error(), "JG011") {
		t.Fatalf("next on a consumer read over NATS: %v, want JG011", err)
	}
	if err := raw.Exec(ctx, `SELECT jetgres.read_in_sql('ORDERS', 'C')`); err != nil {
		t.Fatal(err)
	}
	_, err = next(ctx, raw, 1, false)
	if err == nil || !strings.Contains(err.Error(), "JG012") {
		t.Fatalf("next while a replica holds the consumer: %v, want JG012", err)
	}
	gone, err := own.Deleted(ctx)
	if err != nil || len(gone) != 1 || gone[0].ID != id {
		t.Fatalf("Deleted = %v, %v: want the consumer switched to SQL", gone, err)
	}
	if err := own.Unlock(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := own.TryLock(ctx, key); !errors.Is(err, pg.ErrReadInSQL) || !errors.Is(err, pg.ErrServedElsewhere) || ok {
		t.Fatalf("TryLock of a consumer read in SQL = %v, %v: want refused with ErrReadInSQL", ok, err)
	}
	if claimed, _, err := own.ClaimFree(ctx, []int64{st.ID}, true); err != nil || len(claimed) != 0 {
		t.Fatalf("ClaimFree = %v, %v: want nothing", claimed, err)
	}
	attempt(t, raw, true, func(ctx context.Context, q rawsql.Runner) error {
		ds, err := next(ctx, q, 5, false)
		if err == nil && fmt.Sprint(seqs(ds)) != "[1 2]" {
			err = fmt.Errorf("got %v, want [1 2]", seqs(ds))
		}
		return err
	})
	if err := raw.Exec(ctx, `SELECT jetgres.read_over_nats('ORDERS', 'C')`); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := own.TryLock(ctx, key); err != nil || !ok {
		t.Fatalf("TryLock of a consumer given back to NATS = %v, %v: want taken", ok, err)
	}
}

// TestSQLConsumeReadmeExample runs the README's orders service as written there.
func TestSQLConsumeReadmeExample(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url+" pool_max_conns=1")
	st, err := db.CreateStream(ctx, "ORDERS", []byte(`{"name":"ORDERS","subjects":["orders.>"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "accept",
		Config: []byte(`{"durable_name":"accept","ack_policy":"explicit","filter_subject":"orders.>"}`)}, 0); err != nil {
		t.Fatal(err)
	}
	if err := raw.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'new', accepted_seq bigint);
		INSERT INTO orders (id) SELECT generate_series(1, 150)`); err != nil {
		t.Fatal(err)
	}
	var msgs []pg.AppendMsg
	for i := 1; i <= 150; i++ {
		msgs = append(msgs, pg.AppendMsg{Subject: "orders.created", Data: fmt.Appendf(nil, `{"id": %d}`, i)})
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, time.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	if err := raw.Exec(ctx, `SELECT jetgres.read_in_sql('ORDERS', 'accept')`); err != nil {
		t.Fatal(err)
	}
	worker := `BEGIN;
CREATE TEMP TABLE batch ON COMMIT DROP AS
    SELECT * FROM jetgres.next('ORDERS', 'accept', 100);
UPDATE orders o SET status = 'accepted', accepted_seq = b.seq
FROM batch b
WHERE o.id = (convert_from(b.data, 'UTF8')::jsonb ->> 'id')::bigint;
SELECT jetgres.ack_through('ORDERS', 'accept', max(seq)) FROM batch HAVING count(*) > 0;
`
	for _, end := range []string{"ROLLBACK", "COMMIT", "COMMIT", "COMMIT"} {
		if err := raw.Exec(ctx, worker+end+";"); err != nil {
			t.Fatal(err)
		}
	}
	var accepted int
	var floor int64
	if err := raw.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE status = 'accepted' AND accepted_seq = id),
		(SELECT ack_stream_seq FROM jetgres.consumers WHERE name = 'accept')`).Scan(&accepted, &floor); err != nil {
		t.Fatal(err)
	}
	if accepted != 150 || floor != 150 {
		t.Fatalf("%d orders accepted, ack floor %d: want 150 and 150", accepted, floor)
	}
}

// jetgres_consumer may read and ack in SQL, switch a consumer, and nothing else.
func TestSQLConsumeRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlConsumer(t, `{"durable_name":"C","ack_policy":"explicit"}`, 2)
	if err := raw.Exec(ctx, `SELECT jetgres.read_over_nats('ORDERS', 'C')`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql string
		ok  bool
	}{
		{`SELECT jetgres.read_in_sql('ORDERS', 'C')`, true},
		{`SELECT setval('jetgres.sqlc_attempt_1', 0)`, false},
		{`SELECT count(*) FROM jetgres.next('ORDERS', 'C', 10, true)`, true},
		{`SELECT jetgres.ack('ORDERS', 'C', 1)`, true},
		{`SELECT jetgres.ack_through('ORDERS', 'C', 2)`, true},
		{`SELECT jetgres.read_over_nats('ORDERS', 'C')`, true},
		{`SELECT count(*) FROM jetgres.messages('ORDERS')`, false},
		{`SELECT jetgres.publish('orders.x', 'x'::text)`, false},
		{`SELECT count(*) FROM jetgres.sql_consumers`, false},
		{`SELECT count(*) FROM jetgres.sql_pending`, false},
		{`UPDATE jetgres.consumers SET ack_stream_seq = 0`, false},
		{`SELECT jetgres.sqlc_enter('ORDERS', 'C', true)`, false},
		{`SELECT jetgres.sqlc_settle(1, 1, NULL, 0, 0, 2)`, false},
	} {
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			if err := q.Exec(ctx, `SET LOCAL ROLE jetgres_consumer`); err != nil {
				t.Fatal(err)
			}
			return q.Exec(ctx, c.sql)
		})
		if (err == nil) != c.ok {
			t.Errorf("as jetgres_consumer, %s: err %v, want allowed %v", c.sql, err, c.ok)
		}
		if err != nil && sqlState(err) != "42501" {
			t.Errorf("as jetgres_consumer, %s: %v, want insufficient privilege (42501)", c.sql, err)
		}
	}
}

// jetgres.next keeps its statements prepared in the caller's session. A generic plan of a
// read of jetgres.msgs, which PostgreSQL may choose after five calls, locks and opens every
// chunk of every stream at each call; each call must open only its own stream's.
func TestSQLNextOpensOnlyItsOwnChunks(t *testing.T) {
	t.Parallel()
	url, db, _ := sqlConsumer(t, `{"ack_policy":"explicit"}`, 100)
	for i := range 30 {
		name := fmt.Sprintf("OTHER%d", i)
		st, err := db.CreateStream(t.Context(), name, []byte(fmt.Sprintf(`{"name":%q,"subjects":["other%d.>"]}`, name, i)))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: fmt.Sprintf("other%d.x", i)}}}}, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	one := rawsql.Open(t, url+" pool_max_conns=1") // one session, whose plans jetgres.next keeps
	// Every third attempt rolls back, so that the next one hands its messages out again.
	for call := range 12 {
		commit := call%3 != 1
		attempt(t, one, commit, func(ctx context.Context, q rawsql.Runner) error {
			got, err := next(ctx, q, 5, false)
			if err != nil || len(got) != 5 {
				return fmt.Errorf("call %d: %d messages, %v", call, len(got), err)
			}
			if err := q.Exec(ctx, `SELECT jetgres.ack_through('ORDERS', 'C', $1)`, got[4].seq); err != nil {
				return err
			}
			var others int
			err = q.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
				JOIN jetgres.chunks k ON c.relname = format('msgs_%s_%s', k.stream_id, k.chunk)
				JOIN jetgres.streams s ON s.id = k.stream_id
				WHERE l.pid = pg_backend_pid() AND s.name <> 'ORDERS'`).Scan(&others)
			if err != nil {
				return err
			}
			if others > 0 {
				t.Errorf("call %d holds locks on %d chunk tables of other streams", call, others)
			}
			if !commit {
				return errRollback
			}
			return nil
		})
	}
}
