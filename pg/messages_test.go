package pg_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// twoReplicas opens two pools, as two jetgres replicas would, on one fresh migrated database
// holding one stream.
func twoReplicas(t *testing.T) (a, b *pg.DB, st pg.StreamRow) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	open := func() *pg.DB {
		db, err := pg.Open(ctx, pg.Config{URL: url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		return db
	}
	a, b = open(), open()
	if err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := a.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return a, b, st
}

// Two replicas append to one stream in turns. Each remembers its own last commit and tries
// the one-round-trip path first; the state row's guard must send it to the general path
// whenever the other replica wrote in between, so that sequences stay dense and unique. After
// each append the replica reads everything back: a chunk the other replica opened must not be
// missing from what it reads, however its chunk list was last loaded.
func TestAppendTwoReplicasKeepSequencesDense(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, st := twoReplicas(t)
	const rounds = 50
	seen := make(map[uint64]string) // sequence → data

	for i := range rounds {
		for name, db := range map[string]*pg.DB{"a": a, "b": b} {
			// Every few rounds a replica appends twice in a row, so both paths run.
			for range 1 + i%3 {
				// Batches of one and of three: the fast path writes them differently.
				msgs := make([]pg.AppendMsg, 1+2*(i%2))
				for k := range msgs {
					msgs[k] = pg.AppendMsg{Subject: "s", Data: []byte(fmt.Sprint(name, i, k))}
				}
				res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 40, Msgs: msgs}}, 1)
				if err != nil {
					t.Fatalf("%s round %d: %v", name, i, err)
				}
				for k, o := range res[0].Outcomes {
					if prev, dup := seen[o.Seq]; dup {
						t.Fatalf("sequence %d given to %s and %s", o.Seq, prev, msgs[k].Data)
					}
					seen[o.Seq] = string(msgs[k].Data)
				}
				upTo := res[0].LastSeq
				got, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: upTo, MaxMsgs: int(upTo) + 1}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if uint64(len(got)) != upTo {
					t.Fatalf("%s round %d: read %d messages of 1..%d", name, i, len(got), upTo)
				}
			}
		}
	}
	state, err := a.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(len(seen))
	if state.FirstSeq != 1 || state.LastSeq != n || state.Msgs != n {
		t.Fatalf("state %+v, want 1..%d", state, n)
	}
	msgs, _, _, err := b.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: n, MaxMsgs: int(n) + 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(len(msgs)) != n {
		t.Fatalf("read %d messages, want %d", len(msgs), n)
	}
	for i, m := range msgs {
		if m.Seq != uint64(i+1) || string(m.Data) != seen[m.Seq] || m.Subject != "s" {
			t.Fatalf("message %d: sequence %d, subject %q, data %q, want data %q", i, m.Seq, m.Subject, m.Data, seen[m.Seq])
		}
	}
}

// The maintainer moves an emptied stream to a new chunk behind the back of the append path's
// remembered state. The next append must land in the new chunk, not in the retired one.
func TestAppendAfterChunkRetiredByMaintainer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	appendOne := func() uint64 {
		t.Helper()
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte("x")}}}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res[0].Outcomes[0].Seq
	}
	appendOne()
	appendOne()
	if _, err := db.Purge(ctx, st.ID, pg.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	if err := db.RetireIdleChunk(ctx, st.ID, 0); err != nil {
		t.Fatal(err)
	}
	if seq := appendOne(); seq != 3 {
		t.Fatalf("sequence %d after the retirement, want 3", seq)
	}
	if err := db.CheckHoldings(ctx, st.ID); err != nil {
		t.Fatal(err)
	}
	msgs, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: 3, MaxMsgs: 10}, nil)
	if err != nil || len(msgs) != 1 || msgs[0].Seq != 3 {
		t.Fatalf("read %+v, %v; want only sequence 3", msgs, err)
	}
	// The retired chunk's table may still be there, and nothing may have gone into it: a row
	// there would be invisible to reads, and hold sequence 3 twice.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'jetgres' AND table_name LIKE $1`, fmt.Sprintf(`msgs\_%d\_%%`, st.ID))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	copies := 0
	for _, table := range tables {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{"jetgres", table}.Sanitize()+` WHERE seq = 3`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		copies += n
	}
	if copies != 1 {
		t.Fatalf("sequence 3 is stored %d times across the stream's chunks, want once", copies)
	}
}

// A database whose default collation is linguistic, as many are: chunk tables still compare
// subjects byte by byte, so that a wildcard filter's anchored prefix narrows the subject index
// instead of reading every row of a chunk.
func TestChunkSubjectsCompareBytewise(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDBWith(t, `LOCALE_PROVIDER icu ICU_LOCALE 'en-US'`)
	db := pgtest.OpenAt(t, url)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "orders.new", Data: []byte("x")}}}}, 1); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var table, collation string
	if err := conn.QueryRow(ctx, `SELECT c.table_name, coalesce(c.collation_name, '')
		FROM information_schema.columns c
		WHERE c.table_schema = 'jetgres' AND c.table_name LIKE 'msgs\_%' AND c.column_name = 'subject'`).Scan(&table, &collation); err != nil {
		t.Fatal(err)
	}
	if collation != "C" {
		t.Errorf("%s.subject collates as %q, want C", table, collation)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `EXPLAIN SELECT seq FROM jetgres.`+table+` WHERE subject ~ $1`, pg.SubjectRegexp("orders.*"))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "Index Cond: ((subject >= 'orders.'") {
		t.Errorf("a wildcard filter does not narrow the subject index:\n%s", strings.Join(plan, "\n"))
	}
}

// A replica opens a chunk after another replica opened and filled the one before it, which
// the first never loaded: its chunk list has a gap, and a read right after its own append
// must still find the other replica's chunk.
func TestReadAfterAppendPastAnotherReplicasChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b, st := twoReplicas(t)
	appendN := func(db *pg.DB, n int) uint64 {
		t.Helper()
		msgs := make([]pg.AppendMsg, n)
		for i := range msgs {
			msgs[i] = pg.AppendMsg{Subject: "s", Data: []byte("x")}
		}
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, ChunkRows: 10, Msgs: msgs}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res[0].LastSeq
	}
	readAll := func(db *pg.DB, upTo uint64) int {
		t.Helper()
		got, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: upTo, MaxMsgs: int(upTo) + 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(got)
	}
	readAll(a, appendN(a, 5)) // a knows chunk 0
	appendN(b, 10)            // b fills chunk 0 and opens chunk 1
	appendN(b, 5)             // and fills it
	last := appendN(a, 5)     // a opens chunk 2 without ever seeing chunk 1
	if n := readAll(a, last); n != int(last) {
		t.Fatalf("read %d messages of 1..%d after a chunk another replica opened", n, last)
	}
}

// A read decodes the same messages whatever exec mode the connection string asks pgx for:
// exec and simple_protocol (the modes for transaction poolers) return text columns.
func TestReadInEveryExecMode(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	st, err := db.CreateStream(ctx, "MODES", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []pg.AppendMsg{
		{Subject: "a.one", Data: []byte("payload\x00\xff")},
		{Subject: "a.one", Header: []byte("NATS/1.0\r\nK: v\r\n\r\n"), Data: []byte("with header")},
		{Subject: "b.two", Data: []byte{}},
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, 1); err != nil {
		t.Fatal(err)
	}
	want, _, _, err := db.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: 3, MaxMsgs: 10}, nil)
	if err != nil || len(want) != 3 {
		t.Fatalf("read %d messages: %v", len(want), err)
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		other, err := pg.Open(ctx, pg.Config{URL: pgtest.WithParam(t, url, "default_query_exec_mode", mode)})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		// Unfiltered and filtered reads take different statements.
		for _, filters := range [][]string{nil, {"a.one", "b.two"}} {
			got, through, _, err := other.ReadFiltered(ctx, pg.ReadParams{StreamID: st.ID, From: 1, UpTo: 3, MaxMsgs: 10}, filters)
			if err != nil {
				t.Fatalf("%s %v: %v", mode, filters, err)
			}
			if through != 3 || len(got) != len(want) {
				t.Fatalf("%s %v: %d messages through %d, want %d through 3", mode, filters, len(got), through, len(want))
			}
			for i := range want {
				g, w := got[i], want[i]
				if g.Seq != w.Seq || g.TS != w.TS || g.Subject != w.Subject || string(g.Header) != string(w.Header) || string(g.Data) != string(w.Data) || (g.Header == nil) != (w.Header == nil) {
					t.Errorf("%s %v: message %d = %+v, want %+v", mode, filters, i, g, w)
				}
			}
		}
		other.Close()
	}
}
