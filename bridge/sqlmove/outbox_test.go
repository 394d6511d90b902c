package sqlmove

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// Rows inserted into jetgres.outbox, with INSERT and with COPY, join what jetgres.publish
// staged in one order: a transaction's messages in the order it wrote them, whichever way.
// What the outbox could not check at the insert is rejected at the move, kept in
// jetgres.outbox_rejected as it was inserted, and counted; the rest is stored.
func TestOutboxMovedInOrderAndRejectedKept(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	createStream(t, db, `{"name":"A","subjects":["a.>"],"max_msg_size":64}`)
	createStream(t, db, `{"name":"C","subjects":["c.>"],"max_msgs":1,"discard":"new"}`)
	raw := rawsql.Open(t, url)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`SELECT jetgres.publish('a.1', 'one'::text)`,
		`INSERT INTO jetgres.outbox (subject, data) VALUES ('a.2', 'two')`,
		`SELECT jetgres.publish('a.3', 'three'::text)`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"jetgres", "outbox"}, []string{"subject", "data", "headers"}, pgx.CopyFromRows([][]any{
		{"a.4", []byte("four"), map[string]any{"H": "v", "Multi": []string{"x", "y"}}},
		{"a.5", []byte("five"), nil},
	})); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO jetgres.outbox (subject, data, headers) VALUES
		('a.*', 'wildcard', NULL),
		('nowhere.1', 'no stream', NULL),
		('a.6', 'bad headers', '{"H": 1}'),
		('a.7', convert_to(repeat('x', 100), 'UTF8'), NULL),
		('c.1', 'kept', NULL),
		('c.2', 'over the limit', '{"Why": "limit"}')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := startMover(t, db, newHost(t, db), reg)
	streamHolds(t, ctx, raw, "A", 5)
	streamHolds(t, ctx, raw, "C", 1)
	if got := raw.Strings(t, `SELECT seq || ' ' || subject || ' ' || convert_from(data, 'UTF8') || ' ' || coalesce(headers::text, '-')
		FROM jetgres.messages('A')`); !slices.Equal(got, []string{
		"1 a.1 one -", "2 a.2 two -", "3 a.3 three -", `4 a.4 four {"H": ["v"], "Multi": ["x", "y"]}`, "5 a.5 five -",
	}) {
		t.Errorf("A holds\n%s", strings.Join(got, "\n"))
	}
	want := []string{
		`outbox - a.* invalid_subject wildcard - -`,
		`outbox - nowhere.1 no_stream no stream - -`,
		`outbox - a.6 bad_headers bad headers {"H": 1} true`,
		`outbox A a.7 too_large ` + strings.Repeat("x", 100) + ` - -`,
		`outbox C c.2 limit over the limit {"Why": "limit"} true`,
	}
	testwait.For(t, 30*time.Second, func() error {
		got := raw.Strings(t, `SELECT source || ' ' || coalesce(stream, '-') || ' ' || subject || ' ' || reason || ' '
			|| convert_from(data, 'UTF8') || ' ' || coalesce(headers::text, '-') || ' ' || coalesce((detail <> '')::text, '-')
			FROM jetgres.outbox_rejected ORDER BY rejected_at, subject`)
		slices.Sort(got)
		w := slices.Sorted(slices.Values(want))
		if !slices.Equal(got, w) {
			return fmt.Errorf("jetgres.outbox_rejected holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(w, "\n"))
		}
		return nil
	})
	for reason, n := range map[string]float64{"invalid_subject": 1, stream.ReasonNoStream: 1, "bad_headers": 1,
		stream.ReasonTooLarge: 1, stream.ReasonLimit: 1} {
		if got := testutil.ToFloat64(m.m.refused.WithLabelValues(reason)); got != n {
			t.Errorf("refused %q: %v, want %v", reason, got, n)
		}
	}
	if got := testutil.ToFloat64(m.m.moved); got != 6 {
		t.Errorf("moved %v, want 6", got)
	}
}

// Both outbox tables are truncated once what they hold is moved: the outbox keeps no dead
// rows and needs no VACUUM.
func TestOutboxTablesTruncatedOnceMoved(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, raw := sqlDB(t, `{"name":"A","subjects":["a.>"]}`)
	startMover(t, db, newHost(t, db), nil)
	// Rows land in both tables: the mover turns the outbox every second.
	sizes := `SELECT pg_relation_size('jetgres.outbox_0') > 0, pg_relation_size('jetgres.outbox_1') > 0`
	n, slots := 0, map[string]bool{}
	testwait.For(t, 30*time.Second, func() error {
		got := raw.Strings(t, `INSERT INTO jetgres.outbox (subject, data) SELECT 'a.' || g, 'x' FROM generate_series(1, 100) g RETURNING (call >> 20) & 1`)
		n += len(got)
		for _, s := range got {
			slots[s] = true
		}
		if len(slots) < 2 {
			return fmt.Errorf("rows went to tables %v only", slots)
		}
		return nil
	})
	streamHolds(t, ctx, raw, "A", n)
	testwait.For(t, 30*time.Second, func() error {
		var full0, full1 bool
		if err := raw.QueryRow(ctx, sizes).Scan(&full0, &full1); err != nil {
			return err
		}
		if full0 || full1 {
			return fmt.Errorf("outbox_0 holds pages: %v, outbox_1: %v", full0, full1)
		}
		return nil
	})
}
