package rawsql_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestTxCommitsOrRollsBack(t *testing.T) {
	ctx := t.Context()
	db := rawsql.Open(t, pgtest.NewDB(t))
	if err := db.Exec(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	if err := db.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
		return q.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1)
	}); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("fn failed")
	if err := db.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
		if err := q.Exec(ctx, `INSERT INTO t VALUES ($1)`, 2); err != nil {
			return err
		}
		return failed
	}); !errors.Is(err, failed) {
		t.Fatalf("Tx returned %v, want fn's error", err)
	}
	rows, err := db.Query(ctx, `SELECT v FROM t ORDER BY v`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{1}) {
		t.Errorf("rows %v, want the committed 1 and not the rolled-back 2", got)
	}
	if got := db.Strings(t, `SELECT v::text FROM t ORDER BY v`); !slices.Equal(got, []string{"1"}) {
		t.Errorf("Strings: %q, want [1]", got)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
		t.Errorf("QueryRow: %d, %v; want 1", n, err)
	}
}
