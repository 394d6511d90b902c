package pg_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// toStreams is the bridge's planner at its simplest: every staged message goes to its
// stream, and what the move found wrong, or the append refused, is rejected.
type toStreams struct {
	origin [][]int // by batch and message, the staged index
}

func (p *toStreams) Plan(staged []pg.StagedMsg) ([]pg.AppendBatch, []pg.Rejection, error) {
	var out []pg.AppendBatch
	var rejected []pg.Rejection
	p.origin = nil
	idx := map[int64]int{}
	for k, m := range staged {
		if m.Problem != "" {
			rejected = append(rejected, pg.Rejection{Staged: k, Reason: m.Problem, Detail: m.Detail})
			continue
		}
		i, ok := idx[m.StreamID]
		if !ok {
			i = len(out)
			idx[m.StreamID] = i
			out = append(out, pg.AppendBatch{StreamID: m.StreamID})
			p.origin = append(p.origin, nil)
		}
		out[i].Msgs = append(out[i].Msgs, pg.AppendMsg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		p.origin[i] = append(p.origin[i], k)
	}
	return out, rejected, nil
}

func (p *toStreams) Refused(results []pg.AppendResult) []pg.Rejection {
	var rejected []pg.Rejection
	for i, r := range results {
		for j, o := range r.Outcomes {
			if o.Err != nil {
				rejected = append(rejected, pg.Rejection{Staged: p.origin[i][j], Reason: "refused", Detail: o.Err.Error()})
			}
		}
	}
	return rejected
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// sqlDB opens a fresh database with the streams of configs (their JSON configurations)
// created, and a raw connection to it for calling the SQL functions.
func sqlDB(t *testing.T, configs ...string) (url string, db *pg.DB, raw *rawsql.Pool) {
	t.Helper()
	url = pgtest.NewDB(t)
	db = pgtest.OpenAt(t, url)
	raw = rawsql.Open(t, url)
	for _, c := range configs {
		var cfg struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(c), &cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := db.CreateStream(t.Context(), cfg.Name, []byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	return url, db, raw
}

func TestSQLPublishMovesCommittedInCallOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, db, raw := sqlDB(t, `{"name":"ORDERS","subjects":["orders.>"]}`)
	publish := func(commit bool, subjects ...string) {
		t.Helper()
		errRollback := errors.New("rollback")
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			for _, s := range subjects {
				if err := q.Exec(ctx, `SELECT jetgres.publish($1, $2::text, '{"K":["a","b"]}')`, s, "data "+s); err != nil {
					return err
				}
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if err != nil && !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
	}
	publish(true, "orders.1", "orders.2", "orders.3")
	publish(false, "orders.gone")
	publish(true, "orders.4")

	// A transaction still running anywhere on the cluster (another test's) holds moves
	// back until it ends.
	moved := 0
	testwait.For(t, 30*time.Second, func() error {
		taken, res, _, err := db.MoveStaged(ctx, 2, &toStreams{}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if taken > 2 || (taken > 0 && (len(res) != 1 || len(res[0].Stored) != taken)) {
			t.Fatalf("move: taken %d, results %+v; want at most 2, each stored", taken, res)
		}
		if moved += taken; moved < 4 {
			return fmt.Errorf("moved %d of 4", moved)
		}
		return nil
	})
	if taken, _, _, err := db.MoveStaged(ctx, 100, &toStreams{}, 3); err != nil || taken != 0 {
		t.Fatalf("last move: taken %d, err %v; want nothing left", taken, err)
	}

	rows, err := raw.Query(ctx, `SELECT seq, subject, headers::text, convert_from(data, 'UTF8') FROM jetgres.messages('ORDERS')`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var seq int64
		var subj, hdr, data string
		if err := rows.Scan(&seq, &subj, &hdr, &data); err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{subj, hdr, data}, "|"))
		if int(seq) != len(got) {
			t.Errorf("row %d has sequence %d", len(got), seq)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`orders.1|{"K": ["a", "b"]}|data orders.1`,
		`orders.2|{"K": ["a", "b"]}|data orders.2`,
		`orders.3|{"K": ["a", "b"]}|data orders.3`,
		`orders.4|{"K": ["a", "b"]}|data orders.4`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("jetgres.messages:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSQLPublishErrorsAtTheCall(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlDB(t, `{"name":"S","subjects":["s.*"],"max_msg_size":30}`, `{"name":"BARE"}`)
	for _, c := range []struct {
		sql, state string
	}{
		{`SELECT jetgres.publish('s.a', 'ok'::text)`, ""},
		{`SELECT jetgres.publish('BARE', 'ok'::text)`, ""},
		{`SELECT jetgres.publish('s.a.b', 'x'::text)`, "JG002"},
		{`SELECT jetgres.publish('t', 'x'::text)`, "JG002"},
		{`SELECT jetgres.publish('s.*', 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('s.>', 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('*.a', 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('s.a*', 'ok'::text)`, ""},
		{`SELECT jetgres.publish('s.>>', 'ok'::text)`, ""},
		{`SELECT jetgres.publish('s.a'||repeat('b', 2046), 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('s..a', 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('s. a', 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('', 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish(NULL, 'x'::text)`, "JG001"},
		{`SELECT jetgres.publish('s.a', '1234567890123456789012345678901'::text)`, "JG003"},
		{`SELECT jetgres.publish('s.a', 'x'::text, '[1]')`, "JG004"},
		{`SELECT jetgres.publish('s.a', 'x'::text, '{"A": 1}')`, "JG004"},
		{`SELECT jetgres.publish('s.a', 'x'::text, '{"A B": "v"}')`, "JG004"},
		{`SELECT jetgres.publish('s.a', 'x'::text, '{"A": "v\r\nB: w"}')`, "JG004"},
		{`SELECT jetgres.publish('s.a', '{"k": 1}'::jsonb, '{"A": "v"}')`, ""},
		{`SELECT jetgres.publish('s.a', '\x00ff'::bytea)`, ""},
	} {
		if got := sqlState(raw.Exec(ctx, c.sql)); got != c.state {
			t.Errorf("%s: SQLSTATE %q, want %q", c.sql, got, c.state)
		}
	}
}

// The SQL subject match must agree with the one pg uses in Go, nats-server's.
func TestSQLSubjectMatchesAgreesWithGo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlDB(t)
	filters := []string{">", "*", "a", "a.b", "a.*", "a.>", "*.b", "*.*", "*.>", "a.*.c", "a.b.>", "b.>", "a.b.c.d",
		"a+b.*", "$KV.x.>", "é.[x]", "a\\b.>", "(a|b)"}
	subjects := []string{"a", "b", "a.b", "a.c", "b.b", "a.b.c", "a.x.c", "a.b.c.d", "x.y.z",
		"a+b.c", "aab.c", "$KV.x.k", "é.[x]", "é.x", "a\\b.c", "ab.c", "a", "(a|b)"}
	for _, f := range filters {
		for _, s := range subjects {
			var got bool
			if err := raw.QueryRow(ctx, `SELECT $2 ~ jetgres.subject_regexp($1)`, f, s).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := pg.SubjectMatches(f, s); got != want {
				t.Errorf("%q ~ subject_regexp(%q) = %v, Go says %v", s, f, got, want)
			}
		}
	}
}

// jetgres.messages passes the caller's filters into the statement it runs on each chunk,
// where the indexes serve them: auto_explain shows those nested statements' plans.
func TestSQLMessagesUseTheIndexes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	st, err := db.CreateStream(ctx, "S", []byte(`{"name":"S","subjects":["s.>"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []pg.AppendMsg
	for i := range 5000 {
		msgs = append(msgs, pg.AppendMsg{Subject: fmt.Sprintf("s.%d", i%50), Data: []byte("x")})
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, 1); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		plans = append(plans, n.Message)
		mu.Unlock()
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for _, s := range []string{`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_nested_statements = on`, `SET auto_explain.log_level = notice`, `ANALYZE`} {
		if _, err := c.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	for _, c2 := range []struct {
		query, index string
	}{
		{`SELECT count(*) FROM jetgres.messages('S', 4990)`, "_pkey"},
		{`SELECT count(*) FROM jetgres.messages('S', NULL, 's.7')`, "_subject_seq_idx"},
	} {
		mu.Lock()
		plans = nil
		mu.Unlock()
		var n int
		if err := c.QueryRow(ctx, c2.query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		all := strings.Join(plans, "\n")
		mu.Unlock()
		if !regexp.MustCompile(`Index (Only )?Scan (using|on) msgs_\d+_\d+` + c2.index).MatchString(all) {
			t.Errorf("%s: no index scan on %s among the nested plans:\n%s", c2.query, c2.index, all)
		}
	}
}

// The mover's read of what is ready takes each staging table in index order from the
// progress and stops at its limit: a backlog left while jetgres was down must not cost every
// move a sort of all of it.
func TestStagedReadyReadsInIndexOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlDB(t, `{"name":"S","subjects":["s.>"]}`)
	for range 3 {
		if err := raw.Exec(ctx, `SELECT jetgres.publish('s.x', g::text) FROM generate_series(1, 2000) g`); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.Exec(ctx, `ANALYZE jetgres.staged_0; ANALYZE jetgres.staged_1`); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(raw.Strings(t, `EXPLAIN (COSTS OFF) SELECT * FROM jetgres.staged_ready(100)`), "\n")
	if !regexp.MustCompile(`(?s)Limit\s*\n\s*->\s*Merge Append.*Index Scan using staged_0_order on staged_0 s\s*\n\s*Index Cond: \(\(ROW\(xid, call\) > ROW\(\$\d+, \$\d+\)\)`).MatchString(all) {
		t.Errorf("jetgres.staged_ready(100) does not merge index scans that start at the progress:\n%s", all)
	}
}

// jetgres_publisher may publish and nothing else; jetgres_reader may read messages and the
// views and nothing else.
func TestSQLRoles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlDB(t, `{"name":"S","subjects":["s.>"]}`)
	for _, c := range []struct {
		role, sql string
		ok        bool
	}{
		{"jetgres_publisher", `SELECT jetgres.publish('s.a', 'x'::text)`, true},
		{"jetgres_publisher", `SELECT jetgres.publish('s.a', '{}'::jsonb)`, true},
		{"jetgres_publisher", `SELECT jetgres.publish('s.a', '\x01'::bytea)`, true},
		{"jetgres_publisher", `SELECT count(*) FROM jetgres.messages('S')`, false},
		{"jetgres_publisher", `SELECT count(*) FROM jetgres.stream_list`, false},
		{"jetgres_publisher", `SELECT count(*) FROM jetgres.staged_0`, false},
		{"jetgres_publisher", `INSERT INTO jetgres.staged_0 (call, stream_id, subject, data) VALUES (1, 1, 's.a', '')`, false},
		{"jetgres_publisher", `INSERT INTO jetgres.outbox (subject, data, headers) VALUES ('s.a', 'x', '{"H": "v"}')`, true},
		{"jetgres_publisher", `INSERT INTO jetgres.outbox (subject, xid) VALUES ('s.a', '1')`, false},
		{"jetgres_publisher", `SELECT count(*) FROM jetgres.outbox`, false},
		{"jetgres_publisher", `INSERT INTO jetgres.outbox_0 (subject) VALUES ('s.a')`, false},
		{"jetgres_publisher", `DELETE FROM jetgres.outbox_rejected WHERE reason = 'limit'`, true},
		{"jetgres_reader", `INSERT INTO jetgres.outbox (subject) VALUES ('s.a')`, false},
		{"jetgres_reader", `SELECT count(*) FROM jetgres.messages('S')`, true},
		{"jetgres_reader", `SELECT count(*) FROM jetgres.stream_list`, true},
		{"jetgres_reader", `SELECT count(*) FROM jetgres.consumer_list`, true},
		{"jetgres_reader", `SELECT jetgres.publish('s.a', 'x'::text)`, false},
		{"jetgres_reader", `SELECT count(*) FROM jetgres.streams`, false},
		{"jetgres_reader", `SELECT count(*) FROM jetgres.msgs_1_0`, false},
	} {
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			if err := q.Exec(ctx, `SET LOCAL ROLE `+c.role); err != nil {
				t.Fatal(err)
			}
			return q.Exec(ctx, c.sql)
		})
		if (err == nil) != c.ok {
			t.Errorf("as %s, %s: err %v, want allowed %v", c.role, c.sql, err, c.ok)
		}
		if err != nil && sqlState(err) != "42501" {
			t.Errorf("as %s, %s: %v, want insufficient privilege (42501)", c.role, c.sql, err)
		}
	}
}

func TestSQLPublishNotifiesOnlyWhileNoMoverIsAwake(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, db, raw := sqlDB(t, `{"name":"ORDERS","subjects":["orders.>"]}`)
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(context.Background()) }()
	if _, err := listener.Exec(ctx, "LISTEN "+pg.StagedChannel); err != nil {
		t.Fatal(err)
	}
	// heard counts the publishes' notifications up to a fence of the test's own: they
	// arrive in commit order, so every commit before the fence has been heard by then.
	heard := func() int {
		t.Helper()
		if err := raw.Exec(ctx, `SELECT pg_notify($1, 'fence')`, pg.StagedChannel); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			nt, err := listener.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if nt.Payload == "fence" {
				return n
			}
			n++
		}
	}
	// publish commits twice: a call of jetgres.publish, and an insert of three rows into
	// jetgres.outbox, which notifies once for its statement.
	publish := func() {
		t.Helper()
		if err := raw.Exec(ctx, `SELECT jetgres.publish('orders.1', 'x'::text)`); err != nil {
			t.Fatal(err)
		}
		if err := raw.Exec(ctx, `INSERT INTO jetgres.outbox (subject) SELECT 'orders.' || g FROM generate_series(1, 3) g`); err != nil {
			t.Fatal(err)
		}
	}
	publish()
	if n := heard(); n != 2 {
		t.Fatalf("heard %d notifications with no mover awake, want 2", n)
	}

	awake := db.MoverAwake()
	defer awake.Close()
	if held, err := awake.Hold(ctx); err != nil || !held {
		t.Fatalf("hold: %v, %v; want held", held, err)
	}
	other := db.MoverAwake()
	defer other.Close()
	if held, err := other.Hold(ctx); err != nil || held {
		t.Fatalf("a second mover's hold: %v, %v; want not held while the first is awake", held, err)
	}
	publish()
	if n := heard(); n != 0 {
		t.Fatalf("heard %d notifications while a mover was awake, want none", n)
	}
	horizon, err := awake.Release(ctx)
	if err != nil {
		t.Fatal(err)
	}
	publish()
	if n := heard(); n != 2 {
		t.Fatalf("heard %d notifications once the mover let go, want 2", n)
	}
	testwait.For(t, 30*time.Second, func() error {
		ok, err := db.StagedSettled(ctx, horizon)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return errors.New("transactions below the release's horizon still running")
		}
		return nil
	})
}

// A transaction keeps its last route: the next subject that route does not take must
// still find its own stream, or raise JG002.
func TestSQLPublishRouteKeptInTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, _, raw := sqlDB(t, `{"name":"A","subjects":["a.>"]}`, `{"name":"B","subjects":["b.x"]}`)
	err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
		for _, s := range []string{"a.1", "b.x", "a.2.3", "a.4"} {
			if err := q.Exec(ctx, `SELECT jetgres.publish($1, 'x'::text)`, s); err != nil {
				return err
			}
		}
		err := q.Exec(ctx, `SELECT jetgres.publish('b.y', 'x'::text)`)
		if sqlState(err) != "JG002" {
			t.Errorf("b.y after a.4 in one transaction: %v; want JG002", err)
		}
		return nil
	})
	if err == nil {
		t.Fatal("the transaction committed after an error")
	}
	// The error aborted that transaction; the same calls again, committed, without it.
	if err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
		for _, s := range []string{"a.1", "b.x", "a.2.3", "a.4"} {
			if err := q.Exec(ctx, `SELECT jetgres.publish($1, 'x'::text)`, s); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := raw.Strings(t, `SELECT s.name || ' ' || g.subject FROM (
		SELECT call, stream_id, subject FROM jetgres.staged_0 UNION ALL SELECT call, stream_id, subject FROM jetgres.staged_1) g
		JOIN jetgres.streams s ON s.id = g.stream_id ORDER BY g.call`)
	// The aborted transaction's rows take space until a rotation, but no snapshot sees them.
	if want := "A a.1,B b.x,A a.2.3,A a.4"; strings.Join(got, ",") != want {
		t.Fatalf("staged: %s; want %s", strings.Join(got, ","), want)
	}
}
