package pg_test

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// openBefore opens a fresh database with the embedded migrations numbered below version
// applied, as an older jetgres left it, and a raw connection to it.
func openBefore(t *testing.T, version int) (*pg.DB, *rawsql.Pool) {
	t.Helper()
	url := pgtest.NewDB(t)
	raw := rawsql.Open(t, url)
	db, err := pg.Open(t.Context(), pg.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	before := fstest.MapFS{}
	files, err := fs.Glob(pg.EmbeddedMigrations, "migrations/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		var n int
		if _, err := fmt.Sscanf(f, "migrations/%03d_", &n); err != nil {
			t.Fatal(err)
		}
		if n < version {
			data, err := fs.ReadFile(pg.EmbeddedMigrations, f)
			if err != nil {
				t.Fatal(err)
			}
			before[f] = &fstest.MapFile{Data: data}
		}
	}
	if err := db.MigrateFS(t.Context(), before); err != nil {
		t.Fatal(err)
	}
	return db, raw
}

// oldStream creates a stream as jetgres did before its chunk tables were partitions of
// jetgres.msgs (migration 011): a state row and a first chunk table of its own.
func oldStream(t *testing.T, raw *rawsql.Pool, name, config string) int64 {
	t.Helper()
	var id int64
	if err := raw.QueryRow(t.Context(), `WITH s AS (INSERT INTO jetgres.streams (name, config) VALUES ($1, $2) RETURNING id),
			st AS (INSERT INTO jetgres.stream_state (stream_id, first_seq, last_seq) SELECT id, 1, 0 FROM s)
		SELECT id FROM s`, name, config).Scan(&id); err != nil {
		t.Fatal(err)
	}
	oldChunk(t, raw, id, 0, 1)
	return id
}

// oldChunk creates a chunk table as jetgres did before migration 011.
func oldChunk(t *testing.T, raw *rawsql.Pool, id, chunk int64, first uint64) {
	t.Helper()
	table := fmt.Sprintf("jetgres.msgs_%d_%d", id, chunk)
	for _, sql := range []string{
		`CREATE TABLE ` + table + ` (seq bigint PRIMARY KEY, ts bigint NOT NULL, subject text COLLATE "C" NOT NULL,
			hdr bytea, data bytea NOT NULL, cum_before bigint NOT NULL)`,
		`CREATE INDEX ON ` + table + ` (subject, seq)`,
		fmt.Sprintf(`INSERT INTO jetgres.chunks (stream_id, chunk, first_seq) VALUES (%d, %d, %d)`, id, chunk, first),
	} {
		if err := raw.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
}

// oldAppend stores subjects as jetgres did before migration 011, into the stream's current
// chunk table, opening a new one every perChunk messages, and moves the state row.
func oldAppend(t *testing.T, raw *rawsql.Pool, id int64, perChunk int64, subjects ...string) {
	t.Helper()
	ctx := t.Context()
	var last, cum, chunk, rows int64
	if err := raw.QueryRow(ctx, `SELECT last_seq, cum_bytes, chunk, chunk_rows FROM jetgres.stream_state WHERE stream_id = $1`, id).
		Scan(&last, &cum, &chunk, &rows); err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, subj := range subjects {
		if rows == perChunk {
			chunk, rows = chunk+1, 0
			oldChunk(t, raw, id, chunk, uint64(last+1))
		}
		last++
		data := []byte("payload " + subj)
		if err := raw.Exec(ctx, fmt.Sprintf(`INSERT INTO jetgres.msgs_%d_%d (seq, ts, subject, data, cum_before) VALUES ($1, $2, $3, $4, $5)`, id, chunk),
			last, time.Now().UnixNano(), subj, data, cum); err != nil {
			t.Fatal(err)
		}
		size := int64(pg.MessageSize(false, subj, nil, data))
		cum += size
		bytes += size
		rows++
	}
	if err := raw.Exec(ctx, `UPDATE jetgres.stream_state SET last_seq = $2, cum_bytes = $3, chunk = $4, chunk_rows = $5,
			msgs = msgs + $6, bytes = bytes + $7 WHERE stream_id = $1`,
		id, last, cum, chunk, rows, len(subjects), bytes); err != nil {
		t.Fatal(err)
	}
}

// A database that an older jetgres filled keeps every message through migration 011, reads
// and gets find them through jetgres.msgs, publishes continue in the chunk they were
// filling, and retention drops a chunk that was a table of its own.
func TestPartitionMigrationKeepsMessages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, raw := openBefore(t, 11)
	id := oldStream(t, raw, "OLD", `{"subjects": ["old.>"]}`)
	oldAppend(t, raw, id, 3, "old.a", "old.b", "old.a", "old.c", "old.b")
	other := oldStream(t, raw, "EMPTY", `{"subjects": ["empty.>"]}`)

	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	parts := raw.Strings(t, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'jetgres.msgs'::regclass ORDER BY 1`)
	want := []string{fmt.Sprintf("msgs_%d_0", id), fmt.Sprintf("msgs_%d_1", id), fmt.Sprintf("msgs_%d_0", other)}
	slices.Sort(want)
	if !slices.Equal(parts, want) {
		t.Fatalf("partitions %v, want %v", parts, want)
	}

	got, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: id, From: 1, UpTo: 5, MaxMsgs: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if seqs := seqsOf(got); !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("read %v, want 1 to 5", seqs)
	}
	m, err := db.GetMessage(ctx, id, 4)
	if err != nil || m.Subject != "old.c" || string(m.Data) != "payload old.c" {
		t.Fatalf("get 4: %+v, %v", m, err)
	}
	m, err = db.LastBySubject(ctx, id, "old.a")
	if err != nil || m.Seq != 3 {
		t.Fatalf("last of old.a: %+v, %v", m, err)
	}
	if n := raw.Strings(t, `SELECT seq::text FROM jetgres.messages('OLD')`); len(n) != 5 {
		t.Fatalf("jetgres.messages lists %v, want 5 messages", n)
	}

	// The state row says chunk 1 holds 2 of its 3 rows: the next publish goes there, the one
	// after opens chunk 2.
	for i, wantSeq := range []uint64{6, 7} {
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: id, ChunkRows: 3, Msgs: []pg.AppendMsg{{Subject: "old.new", Data: []byte{byte(i)}}}}}, time.Now().UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		if s := res[0].Outcomes[0].Seq; s != wantSeq {
			t.Fatalf("publish %d stored at %d, want %d", i, s, wantSeq)
		}
	}
	var where []string
	for _, seq := range []int{6, 7} {
		where = append(where, raw.Strings(t, `SELECT c.relname FROM jetgres.msgs m JOIN pg_class c ON c.oid = m.tableoid
			WHERE m.stream_id = $1 AND m.seq = $2`, id, seq)...)
	}
	if wantWhere := []string{fmt.Sprintf("msgs_%d_1", id), fmt.Sprintf("msgs_%d_2", id)}; !slices.Equal(where, wantWhere) {
		t.Fatalf("new messages stored in %v, want %v", where, wantWhere)
	}

	// Purged past chunk 0, the old table goes.
	if _, err := db.Purge(ctx, id, pg.PurgeParams{UpTo: 4}); err != nil {
		t.Fatal(err)
	}
	if n, err := db.DropChunks(ctx, id, time.Hour); err != nil || n != 1 {
		t.Fatalf("dropped %d chunks, %v; want 1", n, err)
	}
	if got := raw.Strings(t, `SELECT coalesce(to_regclass($1)::text, 'gone')`, fmt.Sprintf("jetgres.msgs_%d_0", id)); got[0] != "gone" {
		t.Fatalf("chunk 0 after the drop: %v", got)
	}
	got, _, _, err = db.ReadFiltered(ctx, pg.ReadParams{StreamID: id, From: 1, UpTo: 7, MaxMsgs: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if seqs := seqsOf(got); !slices.Equal(seqs, []uint64{4, 5, 6, 7}) {
		t.Fatalf("read after the purge %v, want 4 to 7", seqs)
	}
}

func seqsOf(msgs []pg.Message) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.Seq
	}
	return out
}

// A transaction that has held jetgres.msgs for longer than a detach may wait (a pg_dump, a
// report) keeps retention from detaching chunks, rather than letting each pass hold up the
// creation of chunks while it waits; the chunks go once it ends, and reads never see them.
func TestChunkDropWaitsOutLongTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	raw := rawsql.Open(t, url)
	const detach = 100 * time.Millisecond
	db := pgtest.OpenWith(t, pg.Config{URL: url, ChunkDetachTimeout: detach})
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 2, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte{byte(i)}}}}}, 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{UpTo: 5}); err != nil {
		t.Fatal(err)
	}

	holding, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	// Released before the pool closes, should the test end early.
	stop := sync.OnceFunc(func() { close(release) })
	t.Cleanup(stop)
	go func() {
		done <- raw.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			var n int
			if err := q.QueryRow(ctx, `SELECT count(*) FROM jetgres.msgs`).Scan(&n); err != nil {
				return err
			}
			close(holding)
			<-release
			return nil
		})
	}()
	<-holding
	deadline := time.Now().Add(10 * time.Second)
	for {
		var old bool
		if err := raw.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE xact_start < now() - make_interval(secs => $1) AND pid <> pg_backend_pid() AND datname = current_database())`,
			detach.Seconds()).Scan(&old); err != nil {
			t.Fatal(err)
		}
		if old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holding transaction never grew older than the detach bound")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, err := db.DropChunks(ctx, st.ID, time.Hour); err != nil || n != 0 {
		t.Fatalf("dropped %d chunks, %v, while a long transaction holds jetgres.msgs; want none", n, err)
	}
	// A detach that had begun would have given up half-way and left its chunk pending.
	if pending := raw.Strings(t, `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhdetachpending`); len(pending) > 0 {
		t.Fatalf("detach begun behind the long transaction: %v pending", pending)
	}
	got, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: 5, MaxMsgs: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if seqs := seqsOf(got); !slices.Equal(seqs, []uint64{5}) {
		t.Fatalf("read %v, want 5", seqs)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err := db.ReapChunks(ctx); err != nil || n != 2 {
		t.Fatalf("reaped %d chunks, %v; want chunks 0 and 1", n, err)
	}
	if left := raw.Strings(t, `SELECT relname FROM pg_class WHERE relnamespace = 'jetgres'::regnamespace AND relkind = 'r' AND relname LIKE 'msgs\_%' ORDER BY 1`); !slices.Equal(left, []string{fmt.Sprintf("msgs_%d_2", st.ID)}) {
		t.Fatalf("chunk tables left %v, want chunk 2 alone", left)
	}
}
