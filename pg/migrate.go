package pg

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrateLockKey is the transaction-level advisory lock that serialises migrating replicas
// ("jetgres" and 1 in ASCII). A transaction-level lock, unlike a session one, cannot outlive a
// connection returned to a pool, or be lost behind a transaction-pooling proxy.
const migrateLockKey int64 = 0x6a65746772657301

// The bookkeeping statements, created under the lock because CREATE … IF NOT EXISTS is not
// safe against a concurrent creator of the same object.
const (
	sqlMigrateLock      = `SELECT pg_advisory_xact_lock($1)`
	sqlMigrationsSchema = `CREATE SCHEMA IF NOT EXISTS jetgres`
	sqlMigrationsTable  = `CREATE TABLE IF NOT EXISTS jetgres.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`
	sqlAppliedMigrations = `SELECT version, name FROM jetgres.schema_migrations ORDER BY version`
	sqlRecordMigration   = `INSERT INTO jetgres.schema_migrations (version, name) VALUES ($1, $2)`
)

// migration is one migrations/NNN_name.up.sql file.
type migration struct {
	version int
	name    string // without the number and suffix: "schema" for 001_schema.up.sql
	file    string
	sql     string
}

var migrationName = regexp.MustCompile(`^([0-9]{3,})_([a-z0-9][a-z0-9_]*)\.up\.sql$`)

// loadMigrations reads and validates every .sql file in fsys's migrations directory. Versions
// must run 1, 2, 3, … without gaps or duplicates, so that a renumbering mistake fails every
// start (and CI) instead of silently skipping a migration.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	var list []migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration %s: the name must look like NNN_name.up.sql (lower case)", e.Name())
		}
		version, err := strconv.Atoi(m[1])
		if err != nil || version < 1 {
			return nil, fmt.Errorf("migration %s: version must be a positive number", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		if strings.TrimSpace(string(b)) == "" {
			return nil, fmt.Errorf("migration %s is empty", e.Name())
		}
		list = append(list, migration{version: version, name: m[2], file: e.Name(), sql: string(b)})
	}
	slices.SortFunc(list, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	for i, m := range list {
		switch {
		case i > 0 && m.version == list[i-1].version:
			return nil, fmt.Errorf("migration version %d appears twice: %s and %s", m.version, list[i-1].file, m.file)
		case m.version != i+1:
			after := "the start"
			if i > 0 {
				after = list[i-1].file
			}
			return nil, fmt.Errorf("migration version %d is missing: %s follows %s", i+1, m.file, after)
		}
	}
	return list, nil
}

// Migrate applies the embedded migrations that the database lacks, each in its own
// transaction that also records it in jetgres.schema_migrations. Several replicas may migrate
// at once: each transaction first takes an advisory lock and then looks at what is applied, so
// every migration runs exactly once. Migrate is bounded by ctx only, since a migration may
// build an index on a large table; cancelling ctx cancels the running statement on the server.
// A migration cannot contain statements that refuse to run in a transaction (CREATE INDEX
// CONCURRENTLY, VACUUM). It fails if the database has a migration this binary does not know:
// a newer jetgres has migrated it.
func (db *DB) Migrate(ctx context.Context) error {
	return db.migrate(ctx, migrationFiles)
}

func (db *DB) migrate(ctx context.Context, fsys fs.FS) error {
	list, err := loadMigrations(fsys)
	if err != nil {
		return fmt.Errorf("pg: %w", err)
	}
	_, err = db.run(ctx, 0, func(ctx context.Context, c *pgx.Conn) error {
		for {
			done, err := db.migrateStep(ctx, c, list)
			if err != nil || done {
				return err
			}
		}
	})
	if err != nil {
		return fmt.Errorf("pg: migrate: %w", err)
	}
	return nil
}

// migrateStep applies the first pending migration, or reports that none is pending.
func (db *DB) migrateStep(ctx context.Context, c *pgx.Conn, list []migration) (done bool, err error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("beginning transaction: %w", err)
	}
	defer func() {
		if err != nil && ctx.Err() == nil {
			_ = tx.Rollback(ctx)
		}
	}()
	for _, stmt := range []struct {
		sql  string
		args []any
	}{{sqlMigrateLock, []any{migrateLockKey}}, {sqlMigrationsSchema, nil}, {sqlMigrationsTable, nil}} {
		if _, err := tx.Exec(ctx, stmt.sql, stmt.args...); err != nil {
			return false, fmt.Errorf("preparing jetgres.schema_migrations: %w", err)
		}
	}
	rows, _ := tx.Query(ctx, sqlAppliedMigrations)
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Version int
		Name    string
	}])
	if err != nil {
		return false, fmt.Errorf("reading jetgres.schema_migrations: %w", err)
	}
	for i, a := range applied {
		switch {
		case a.Version > len(list):
			return false, fmt.Errorf("the database has migration %d (%s) but this jetgres knows only up to %d: a newer jetgres migrated it",
				a.Version, a.Name, len(list))
		case a.Version != i+1:
			return false, fmt.Errorf("jetgres.schema_migrations lacks version %d but has %d", i+1, a.Version)
		case a.Name != list[i].name:
			return false, fmt.Errorf("migration %d is recorded as %q but this jetgres has %s", a.Version, a.Name, list[i].file)
		}
	}
	if len(applied) == len(list) {
		if err := tx.Commit(ctx); err != nil {
			return false, fmt.Errorf("committing: %w", err)
		}
		return true, nil
	}
	m := list[len(applied)]
	start := time.Now()
	// Without arguments pgx uses the simple protocol, which accepts several statements.
	if _, err := tx.Exec(ctx, m.sql); err != nil {
		return false, fmt.Errorf("migration %s: %w", m.file, err)
	}
	if _, err := tx.Exec(ctx, sqlRecordMigration, m.version, m.name); err != nil {
		return false, fmt.Errorf("recording migration %s: %w", m.file, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("committing migration %s: %w", m.file, err)
	}
	db.log.Info("applied migration", "version", m.version, "name", m.name, "elapsed", time.Since(start).Round(time.Millisecond))
	return false, nil
}
