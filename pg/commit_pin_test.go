package pg_test

import (
	"context"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// A connection whose own synchronous_commit is already the configured mode needs no
// statement per transaction to set it, and holds its setting as one of the session's own, so
// that a reload of the server's configuration cannot change it under the transactions that
// skip the statement. One whose setting differs still sets the mode per transaction.
func TestSynchronousCommitPinnedPerConnection(t *testing.T) {
	for _, tc := range []struct {
		conn, mode string
		statements int
	}{
		{"on", "on", 0},
		{"off", "off", 0},
		{"local", "on", 1},
		{"on", "off", 1},
	} {
		t.Run(tc.conn+"-"+tc.mode, func(t *testing.T) {
			ctx := t.Context()
			url := pgtest.WithParam(t, pgtest.NewDB(t), "options", "--synchronous_commit="+tc.conn)
			db, err := pg.Open(ctx, pg.Config{URL: url, MaxConns: 1, SynchronousCommit: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			n, err := db.CommitModeStatements(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.statements {
				t.Fatalf("statements per transaction = %d, want %d", n, tc.statements)
			}
			var setting, source string
			if _, err := db.Hot(ctx, func(ctx context.Context, q pg.Querier) error {
				return q.QueryRow(ctx, `SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'`).Scan(&setting, &source)
			}); err != nil {
				t.Fatal(err)
			}
			if setting != tc.conn || source != "session" {
				t.Fatalf("synchronous_commit = %s from %s, want %s from session", setting, source, tc.conn)
			}
		})
	}
}
