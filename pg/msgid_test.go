package pg_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// appendIDs appends one message per id to a stream with a duplicate window and returns
// the outcomes.
func appendIDs(t *testing.T, db *pg.DB, stream int64, window time.Duration, ts int64, ids ...string) []pg.Outcome {
	t.Helper()
	bt := pg.AppendBatch{StreamID: stream, DupWindow: window}
	for _, id := range ids {
		bt.Msgs = append(bt.Msgs, pg.AppendMsg{Subject: "ids", Data: []byte(id), MsgID: id})
	}
	res, _, err := db.Append(t.Context(), []pg.AppendBatch{bt}, ts)
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Outcomes
}

func idBuckets(t *testing.T, raw *rawsql.Pool, stream int64) []string {
	t.Helper()
	return raw.Strings(t, `SELECT tablename FROM pg_tables WHERE schemaname = 'jetgres' AND tablename LIKE $1 ORDER BY tablename`,
		fmt.Sprintf(`ids\_%d\_%%`, stream))
}

// Ids go to a bucket per duplicate window; a bucket whose ids have all left the window is
// dropped whole, the newest too once it holds nothing live, and none of that changes an
// answer.
func TestMsgIDBucketsRotateAndDrop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	st, err := db.CreateStream(ctx, "IDS", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	const w = 10 * time.Second
	sec := int64(time.Second)
	expect := func(o []pg.Outcome, seq uint64, dup bool) {
		t.Helper()
		if len(o) != 1 || o[0].Err != nil || o[0].Seq != seq || o[0].Duplicate != dup {
			t.Fatalf("outcome %+v, want seq %d duplicate %v", o, seq, dup)
		}
	}
	expect(appendIDs(t, db, st.ID, w, 2*sec, "x"), 1, false) // opens bucket 1
	expect(appendIDs(t, db, st.ID, w, 3*sec, "a"), 2, false)
	expect(appendIDs(t, db, st.ID, w, 5*sec, "a"), 2, true)
	expect(appendIDs(t, db, st.ID, w, 12*sec, "b"), 3, false) // a window after bucket 1 opened: bucket 2
	if got := idBuckets(t, raw, st.ID); len(got) != 2 {
		t.Fatalf("buckets %v, want two", got)
	}
	expect(appendIDs(t, db, st.ID, w, 12*sec, "a"), 2, true)   // bucket 1, read as the previous
	expect(appendIDs(t, db, st.ID, w, 13*sec, "a"), 4, false)  // window passed: stored again, in bucket 2
	expect(appendIDs(t, db, st.ID, w, 21*sec, "b"), 3, true)   // bucket 2, read as the newest
	expect(appendIDs(t, db, st.ID, w, 22*sec, "c"), 5, false)  // opens bucket 3
	expect(appendIDs(t, db, st.ID, w, 22*sec+1, "a"), 4, true) // bucket 2, read as the previous
	expect(appendIDs(t, db, st.ID, w, 25*sec, "d"), 6, false)

	// Cutoff 12s: bucket 1 (ids before 12s) goes; bucket 2 keeps "a" at 13s.
	if n, err := db.PruneMsgIDs(ctx, st.ID, 12*sec); err != nil || n != 1 {
		t.Fatalf("prune at 12s dropped %d buckets, %v; want 1", n, err)
	}
	expect(appendIDs(t, db, st.ID, w, 22*sec+2, "a"), 4, true)
	// Cutoff 23s: bucket 2 goes; bucket 3, the newest, opened before the cutoff but keeps
	// "d" at 25s.
	if n, err := db.PruneMsgIDs(ctx, st.ID, 23*sec); err != nil || n != 1 {
		t.Fatalf("prune at 23s dropped %d buckets, %v; want 1", n, err)
	}
	expect(appendIDs(t, db, st.ID, w, 31*sec, "c"), 5, true)
	// The stream goes idle: once its last id leaves the window, the last bucket goes too.
	if n, err := db.PruneMsgIDs(ctx, st.ID, 40*sec); err != nil || n != 1 {
		t.Fatalf("prune of the idle stream dropped %d buckets, %v; want 1", n, err)
	}
	if got := idBuckets(t, raw, st.ID); len(got) != 0 {
		t.Fatalf("buckets %v after the window passed, want none", got)
	}
	expect(appendIDs(t, db, st.ID, w, 41*sec, "c"), 7, false)

	var dead int64
	if err := raw.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = 'jetgres' AND relname LIKE 'ids\_%'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead tuples in id buckets, want 0", dead)
	}

	// Deleting the stream takes its buckets with it.
	if err := db.DeleteStream(ctx, st.ID); err != nil {
		t.Fatal(err)
	}
	if got := idBuckets(t, raw, st.ID); len(got) != 0 {
		t.Fatalf("buckets %v after the stream was deleted, want none", got)
	}
}

// A lookup reads each bucket through its key, also on a database that has never analyzed
// the bucket: the plan cannot fall back to reading every id of the stream.
func TestMsgIDLookupPlanOnFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	st, err := db.CreateStream(ctx, "FRESH", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	const w = time.Hour
	appendIDs(t, db, st.ID, w, 1, "first")
	bucket := fmt.Sprintf("ids_%d_1", st.ID)
	// Autovacuum must not analyze the bucket behind the test's back.
	if err := raw.Exec(ctx, `ALTER TABLE jetgres.`+bucket+` SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	const batches, per = 40, 500
	for b := range batches {
		ids := make([]string, per)
		for i := range ids {
			ids[i] = fmt.Sprintf("id-%d-%d", b, i)
		}
		appendIDs(t, db, st.ID, w, int64(2+b), ids...)
	}

	var notices []string
	var mu sync.Mutex
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n.Message)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for _, s := range []string{`LOAD 'auto_explain'`, `SET auto_explain.log_min_duration = 0`, `SET auto_explain.log_nested_statements = on`,
		`SET auto_explain.log_analyze = on`, `SET auto_explain.log_level = notice`} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	var analyzed bool
	if err := conn.QueryRow(ctx, `SELECT reltuples >= 0 FROM pg_class WHERE oid = $1::regclass`, "jetgres."+bucket).Scan(&analyzed); err != nil {
		t.Fatal(err)
	}
	if analyzed {
		t.Fatalf("bucket %s has been analyzed or vacuumed: the test needs a fresh one", bucket)
	}

	// Half of the ids looked up are stored, half are not, as the append asks.
	ids := make([]string, 0, per)
	for i := range per / 2 {
		ids = append(ids, fmt.Sprintf("id-%d-%d", i%batches, i), fmt.Sprintf("new-%d", i))
	}
	rows, err := conn.Query(ctx, `SELECT msg_id FROM jetgres.msg_ids_seen($1, $2, $3)`, st.ID, ids, int64(0))
	if err != nil {
		t.Fatal(err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err == nil && len(found) != per/2 {
		err = fmt.Errorf("found %d ids, want %d", len(found), per/2)
	}
	if err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	var plan string
	for _, n := range notices {
		if strings.Contains(n, "FROM jetgres."+bucket) {
			plan = n
		}
	}
	if plan == "" {
		t.Fatalf("no plan of the bucket lookup among the notices:\n%s", strings.Join(notices, "\n---\n"))
	}
	if !strings.Contains(plan, "Index Cond: (msg_id = ANY") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Rows Removed by Filter") {
		t.Fatalf("bucket lookup does not read by its key alone:\n%s", plan)
	}
}

// Migration 006 moves the ids still inside their stream's window from the old table into
// buckets, where they keep answering as duplicates, and leaves the expired ones behind.
func TestMsgIDMigrationMovesLiveIDs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, raw := openBefore(t, 6)
	const window = time.Minute
	id := oldStream(t, raw, "OLD", fmt.Sprintf(`{"duplicate_window": %d}`, window.Nanoseconds()))
	st := pg.StreamRow{ID: id}
	now := time.Now().UnixNano()
	if err := raw.Exec(ctx, `INSERT INTO jetgres.msg_ids (stream_id, msg_id, seq, ts) VALUES
		($1, 'live-1', 7, $2), ($1, 'live-2', 8, $3), ($1, 'expired', 9, $4)`,
		st.ID, now-int64(10*time.Second), now-int64(time.Second), now-int64(2*window)); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var old *string
	if err := raw.QueryRow(ctx, `SELECT to_regclass('jetgres.msg_ids')::text`).Scan(&old); err != nil || old != nil {
		t.Fatalf("old table after the migration: %v, %v; want it gone", old, err)
	}
	if got := idBuckets(t, raw, st.ID); len(got) != 1 {
		t.Fatalf("buckets %v, want one", got)
	}
	out := appendIDs(t, db, st.ID, window, time.Now().UnixNano(), "live-1", "expired", "live-2")
	want := []pg.Outcome{{Seq: 7, Duplicate: true}, {Seq: 1}, {Seq: 8, Duplicate: true}}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("outcomes %+v, want %+v", out, want)
		}
	}
}
