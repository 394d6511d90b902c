package e2e

// The tests' own PostgreSQL servers: a throwaway cluster per test, for jetgres's
// --database-url; one a test stops and starts under a running jetgres; and a probe of the
// test's own into either.

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
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

// pgServer is a private PostgreSQL cluster that a test stops and starts under a running
// jetgres, which reaches it through --database-url.
type pgServer struct {
	t   testing.TB
	dir string

	mu sync.Mutex
	c  *localpg.Cluster // nil while stopped
}

// startPGServer starts a throwaway cluster, stopped when the test ends (after any jetgres
// started later, since cleanups run last-in first-out).
func startPGServer(t testing.TB) *pgServer {
	t.Helper()
	p := &pgServer{t: t, dir: filepath.Join(newDataDir(t), "pg")}
	if err := p.start(); err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("stopping the test PostgreSQL: %v", err)
		}
	})
	return p
}

func (p *pgServer) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := localpg.Start(ctx, localpg.Config{
		DataDir: p.dir,
		// The tests stop the server, never the machine.
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if err != nil {
		return err
	}
	p.c = c
	return nil
}

// stop makes a fast shutdown: connected clients are cut off and the socket goes away.
func (p *pgServer) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := p.c.Stop(ctx)
	p.c = nil
	return err
}

// dsn is the cluster's connection string; it stays the same across stops and starts.
func (p *pgServer) dsn() string {
	return fmt.Sprintf("host=%s port=5432 user=%s dbname=%s sslmode=disable", p.dir, localpg.Superuser, localpg.Database)
}

// openProbe opens a small pool of the test's own on dsn, closed when the test ends.
func openProbe(t testing.TB, dsn string, conns int32) *rawsql.Pool {
	t.Helper()
	return rawsql.Open(t, fmt.Sprintf("%s application_name=e2e-probe pool_max_conns=%d", dsn, conns))
}

// storedFloor reads a consumer's persisted ack floor.
func storedFloor(ctx context.Context, db *rawsql.Pool, stream, consumer string) (uint64, error) {
	var seq int64
	err := db.QueryRow(ctx, `
		SELECT c.ack_stream_seq FROM jetgres.consumers c JOIN jetgres.streams s ON s.id = c.stream_id
		WHERE s.name = $1 AND c.name = $2`, stream, consumer).Scan(&seq)
	return uint64(seq), err
}

// loopbackDSN is the URL of the test's PostgreSQL reached through a proxy listening on
// port of the loopback interface.
func loopbackDSN(port int) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=%s sslmode=disable", port, localpg.Superuser, localpg.Database)
}
