package pg_test

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func migrations(files map[string]string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for name, sql := range files {
		fsys["migrations/"+name] = &fstest.MapFile{Data: []byte(sql)}
	}
	return fsys
}

func TestEmbeddedMigrationsAreValid(t *testing.T) {
	if err := pg.CheckMigrations(pg.EmbeddedMigrations); err != nil {
		t.Fatal(err)
	}
}

func TestMigrationNumbering(t *testing.T) {
	for _, tc := range []struct {
		files map[string]string
		want  string
	}{
		{map[string]string{"001_a.up.sql": "x", "003_c.up.sql": "x"}, "migration version 2 is missing: 003_c.up.sql follows 001_a.up.sql"},
		{map[string]string{"002_b.up.sql": "x"}, "migration version 1 is missing"},
		{map[string]string{"001_a.up.sql": "x", "001_b.up.sql": "x"}, "migration version 1 appears twice"},
		{map[string]string{"001_a.up.sql": "x", "02_b.up.sql": "x"}, "02_b.up.sql: the name must look like NNN_name.up.sql"},
		{map[string]string{"001_a.up.sql": "x", "002_B.up.sql": "x"}, "002_B.up.sql: the name must look like"},
		{map[string]string{"001_a.up.sql": "x", "002_b.down.sql": "x"}, "002_b.down.sql: the name must look like"},
		{map[string]string{"000_a.up.sql": "x"}, "000_a.up.sql: version must be a positive number"},
		{map[string]string{"001_a.up.sql": " \n"}, "migration 001_a.up.sql is empty"},
	} {
		err := pg.CheckMigrations(migrations(tc.files))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.files, err, tc.want)
		}
	}
	ok := migrations(map[string]string{"001_a.up.sql": "x", "002_b.up.sql": "x", "README.md": "ignored"})
	if err := pg.CheckMigrations(ok); err != nil {
		t.Errorf("valid set: %v", err)
	}
}

func TestMigrateEmbedded(t *testing.T) {
	t.Parallel()
	db := pgtest.Open(t) // migrated once already
	if err := db.Migrate(t.Context()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	files, err := fs.Glob(pg.EmbeddedMigrations, "migrations/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM jetgres.schema_migrations`); n != len(files) {
		t.Errorf("%d migrations recorded, want %d", n, len(files))
	}
	if n := count(t, db, `SELECT max(version) FROM jetgres.schema_migrations`); n != len(files) {
		t.Errorf("highest version %d, want %d", n, len(files))
	}
}

var threeMigrations = migrations(map[string]string{
	"001_first.up.sql":  "CREATE TABLE applied (step int); INSERT INTO applied VALUES (1);",
	"002_second.up.sql": "SELECT pg_sleep(0.2); INSERT INTO applied VALUES (2);",
	"003_third.up.sql":  "INSERT INTO applied VALUES (3);",
})

// TestMigrateConcurrently starts four replicas on one fresh database at once: all succeed and
// every migration runs exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	var dbs []*pg.DB
	for range 4 {
		db, err := pg.Open(t.Context(), pg.Config{URL: url, MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		dbs = append(dbs, db)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(dbs))
	for i, db := range dbs {
		wg.Go(func() { errs[i] = db.MigrateFS(t.Context(), threeMigrations) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("replica %d: %v", i, err)
		}
	}
	if n := count(t, dbs[0], `SELECT count(*) FROM applied`); n != 3 {
		t.Errorf("%d rows in applied, want 3 (each migration once)", n)
	}
	if n := count(t, dbs[0], `SELECT count(DISTINCT version) FROM jetgres.schema_migrations WHERE name IN ('first', 'second', 'third')`); n != 3 {
		t.Errorf("%d migrations recorded, want 3", n)
	}
}

func TestMigrateFailureRollsBack(t *testing.T) {
	t.Parallel()
	db := openDB(t, pg.Config{MaxConns: 2})
	bad := migrations(map[string]string{
		"001_first.up.sql":  "CREATE TABLE applied (step int);",
		"002_broken.up.sql": "CREATE TABLE half (x int); INSERT INTO nowhere VALUES (1);",
	})
	err := db.MigrateFS(t.Context(), bad)
	if err == nil || !strings.Contains(err.Error(), "002_broken.up.sql") {
		t.Fatalf("err = %v, want one naming 002_broken.up.sql", err)
	}
	if n := count(t, db, `SELECT count(*) FROM jetgres.schema_migrations`); n != 1 {
		t.Errorf("%d migrations recorded, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_tables WHERE tablename = 'half'`); n != 0 {
		t.Error("the failed migration's first statement was kept")
	}
}

func TestMigrateRefusesUnknownHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, pg.Config{MaxConns: 2})
	if err := db.MigrateFS(ctx, threeMigrations); err != nil {
		t.Fatal(err)
	}
	older := migrations(map[string]string{
		"001_first.up.sql":  "x",
		"002_second.up.sql": "x",
	})
	if err := db.MigrateFS(ctx, older); err == nil || !strings.Contains(err.Error(), "a newer jetgres migrated it") {
		t.Errorf("older binary: %v, want a refusal", err)
	}
	renamed := migrations(map[string]string{
		"001_first.up.sql":   "x",
		"002_renamed.up.sql": "x",
		"003_third.up.sql":   "x",
	})
	if err := db.MigrateFS(ctx, renamed); err == nil || !strings.Contains(err.Error(), `migration 2 is recorded as "second" but this jetgres has 002_renamed.up.sql`) {
		t.Errorf("renamed migration: %v, want a refusal naming it", err)
	}
}
