package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// TestPairStandbyPromoted: a row committed on the primary of a synchronous pair is on the
// standby once the primary is killed and the standby promoted, and the pair's URL then
// reaches the new primary.
func TestPairStandbyPromoted(t *testing.T) {
	p := StartPair(t, PairConfig{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := execOn(ctx, p.URL(), `CREATE TABLE t (v int)`, `INSERT INTO t VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	p.KillPrimary()
	p.Promote()
	db := rawsql.Open(t, p.URL())
	var v int
	if err := db.QueryRow(ctx, `SELECT v FROM t`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("after the promotion: v = %d, %v; want 7", v, err)
	}
	if err := db.Exec(ctx, `INSERT INTO t VALUES (8)`); err != nil {
		t.Fatalf("writing to the new primary: %v", err)
	}
}

// TestPairStandbyDetached: what the primary commits after DetachStandby is not on the
// standby once it is promoted.
func TestPairStandbyDetached(t *testing.T) {
	p := StartPair(t, PairConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := execOn(ctx, p.PrimaryDSN(), `CREATE TABLE t (v int)`, `INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := waitOn(ctx, p.StandbyDSN(), `SELECT count(*) = 1 FROM t`); err != nil {
		t.Fatal(err)
	}
	p.DetachStandby()
	if err := execOn(ctx, p.PrimaryDSN(), `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	p.StopPrimary()
	p.Promote()
	var n int
	if err := withDB(ctx, p.URL(), func(db *rawsql.Pool) error { return db.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n) }); err != nil || n != 1 {
		t.Fatalf("after the promotion: %d rows, %v; want 1", n, err)
	}
}
