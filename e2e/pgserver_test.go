package e2e

// The tests' own PostgreSQL servers: a throwaway cluster per test, for jetgres's --database-url.

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/jetgres/jetgres/embedded/localpg"
)

// testDatabase starts a throwaway PostgreSQL cluster for one test and returns the URL of its
// database, for jetgres's --database-url. The cluster runs without fsync: these tests kill
// jetgres, never the machine. It is stopped when the test ends, after the jetgres started
// later has been (cleanups run last-in first-out).
func testDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := localpg.Start(ctx, localpg.Config{
		DataDir:  filepath.Join(newDataDir(t), "pg"),
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stopping the test PostgreSQL: %v", err)
		}
	})
	return c.DSN()
}
