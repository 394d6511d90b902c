package pg_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// A database left at PostgreSQL's default, jit on, compiles jetgres's reads of many messages
// at 100-200 ms each: jetgres's sessions and the functions applications call turn it off.
func TestJITOffOnADatabaseThatHasItOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	raw := rawsql.Open(t, url)
	if err := raw.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET jit = on', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	db := pgtest.OpenAt(t, url)
	sources, err := db.SettingSources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := sources["jit"]; got != "client" {
		t.Errorf("a pooled session's jit comes from %q, want the client's startup", got)
	}
	for _, fn := range []string{
		"jetgres.next(text, text, integer, boolean)",
		"jetgres.ack(text, text, bigint)",
		"jetgres.ack_through(text, text, bigint)",
		"jetgres.messages(text, bigint, text, bigint)",
	} {
		config := raw.Strings(t, `SELECT unnest(proconfig) FROM pg_proc WHERE oid = $1::regprocedure`, fn)
		if !slices.Contains(config, "jit=off") {
			t.Errorf("%s runs with %q, want jit=off among them", fn, config)
		}
	}
}
