package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jetgres/jetgres/embedded/localpg"
)

// durableSettings are those of an application's database: the shared cluster's fsync and
// synchronous_commit off hide the WAL flush that every commit pays, and that commits which
// serialise (NOTIFY's) cannot share.
var durableSettings = map[string]string{
	"fsync":              "on",
	"synchronous_commit": "on",
	"max_connections":    "200",
	"shared_buffers":     "128MB",
}

// Durable starts a cluster of tb's own with fsync and synchronous_commit on, for benchmarks
// of what commits cost, and returns the connection string of its postgres database. The
// cluster is stopped and its directory removed when tb ends. It needs no Main.
func Durable(tb testing.TB) (url string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "jetgres-bench-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The server may run as another user, which must be able to enter the directory.
	if err := os.Chmod(dir, 0o711); err != nil {
		tb.Fatal(err)
	}
	c, err := localpg.Start(ctx, localpg.Config{DataDir: filepath.Join(dir, "pg"), Settings: durableSettings})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c.DSN()
}
