package pg

import (
	"context"
	"io/fs"
)

// MigrateFS applies the migrations in fsys's migrations directory instead of the embedded ones.
func (db *DB) MigrateFS(ctx context.Context, fsys fs.FS) error { return db.migrate(ctx, fsys) }

// CheckMigrations validates the migrations in fsys's migrations directory.
func CheckMigrations(fsys fs.FS) error {
	_, err := loadMigrations(fsys)
	return err
}

// EmbeddedMigrations is the migrations directory built into the binary.
var EmbeddedMigrations fs.FS = migrationFiles
