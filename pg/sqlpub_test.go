package pg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// movePlan is the bridge's plan at its simplest: every staged message goes to its stream.
func movePlan(staged []pg.StagedMsg) ([]pg.AppendBatch, error) {
	var out []pg.AppendBatch
	idx := map[int64]int{}
	for _, m := range staged {
		i, ok := idx[m.StreamID]
		if !ok {
			i = len(out)
			idx[m.StreamID] = i
			out = append(out, pg.AppendBatch{StreamID: m.StreamID})
		}
		out[i].Msgs = append(out[i].Msgs, pg.AppendMsg{Subject: m.Subject, Header: m.Header, Data: m.Data})
	}
	return out, nil
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func TestSQLPublishMovesCommittedInCallOrder(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	if _, err := db.CreateStream(ctx, "ORDERS", []byte(`{"name":"ORDERS","subjects":["orders.>"]}`)); err != nil {
		t.Fatal(err)
	}
	publish := func(commit bool, subjects ...string) {
		t.Helper()
		errRollback := errors.New("rollback")
		err := raw.Tx(ctx, func(ctx context.Context, q rawsql.Querier) error {
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
		taken, res, _, err := db.MoveStaged(ctx, 2, movePlan, 1)
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
	if taken, _, _, err := db.MoveStaged(ctx, 100, movePlan, 3); err != nil || taken != 0 {
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
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	if _, err := db.CreateStream(ctx, "S", []byte(`{"name":"S","subjects":["s.*"],"max_msg_size":30}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateStream(ctx, "BARE", []byte(`{"name":"BARE"}`)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql, state string
	}{
		{`SELECT jetgres.publish('s.a', 'ok'::text)`, ""},
		{`SELECT jetgres.publish('BARE', 'ok'::text)`, ""},
		{`SELECT jetgres.publish('s.a.b', 'x'::text)`, "JG002"},
		{`SELECT jetgres.publish('t', 'x'::text)`, "JG002"},
		{`SELECT jetgres.publish('s.*', 'x'::text)`, "JG001"},
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
	url := pgtest.NewDB(t)
	pgtest.OpenAt(t, url)
	raw := rawsql.Open(t, url)
	filters := []string{">", "*", "a", "a.b", "a.*", "a.>", "*.b", "*.*", "*.>", "a.*.c", "a.b.>", "b.>", "a.b.c.d"}
	subjects := []string{"a", "b", "a.b", "a.c", "b.b", "a.b.c", "a.x.c", "a.b.c.d", "x.y.z"}
	for _, f := range filters {
		for _, s := range subjects {
			var got bool
			if err := raw.QueryRow(ctx, `SELECT jetgres.subject_matches($1, $2)`, f, s).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := pg.SubjectMatches(f, s); got != want {
				t.Errorf("subject_matches(%q, %q) = %v, Go says %v", f, s, got, want)
			}
		}
	}
}
