// Package pgtest gives tests a real PostgreSQL database of their own.
//
// A test package calls Main from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and each test calls Open (a migrated *pg.DB) or NewDB (the URL of an empty database). Every
// call creates a fresh database (CREATE DATABASE … TEMPLATE template0, with a unique name) and
// drops it when the test ends, so tests may run in parallel and never see each other's rows.
//
// The server is, by default, one throwaway cluster per test process, started with localpg in a
// temporary directory on first use and stopped by Main after the run. For speed it runs with
// fsync=off, synchronous_commit=off and full_page_writes=off: a test that is about durability
// after a crash must start its own cluster with localpg. It also allows 300 connections so
// that parallel tests, each with its own pool, fit.
//
// If JETGRES_TEST_DATABASE_URL is set, that server is used instead: PostgreSQL 13 or later
// (for DROP DATABASE … WITH (FORCE)), with a role that may create databases. The databases are
// created and dropped there the same way.
//
// It also holds what benchmarks need from PostgreSQL besides jetgres itself, for the
// `go test -bench` benchmarks and the bench command alike: the naive queue they measure
// jetgres against (Naive, with BareInsert and VersusInsert on top for tests), StoreFloor, the
// least a batch stored before its PubAcks costs, and Probe, for settings and statistics. With
// package pg, it is the only package that imports pgx.
//
// StartPair starts a primary and a streaming standby of it, clusters of the test's own, for
// tests of failover and switchover: the primary killed or shut down, the standby promoted,
// both reached through one URL of two hosts.
//
// Main stops the cluster even when tests fail, and then checks for leaked goroutines (goleak).
// A test process killed before Main could stop its cluster leaves the cluster's directory
// behind; the next test process to start a cluster stops and removes such leftovers once they
// are more than ten minutes old.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// EnvURL names the environment variable that points the tests at an existing server.
const EnvURL = "JETGRES_TEST_DATABASE_URL"

// clusterSettings are the cluster settings for speed and for many parallel pools (see the package doc).
var clusterSettings = map[string]string{
	"fsync":              "off",
	"synchronous_commit": "off",
	"full_page_writes":   "off",
	"max_connections":    "300",
	"shared_buffers":     "64MB",
}

const (
	startTimeout   = 2 * time.Minute
	adminTimeout   = time.Minute
	dirPrefix      = "jetgres-pgtest-"
	leftoverMinAge = 10 * time.Minute
)

var (
	mainRunning atomic.Bool

	mu     sync.Mutex
	server *testServer // started on first use
)

type testServer struct {
	url     string // maintenance database: CREATE and DROP DATABASE run here
	admin   *rawsql.Pool
	cluster *localpg.Cluster // nil with JETGRES_TEST_DATABASE_URL
	dir     string
	err     error // a failed start fails every later test the same way

	// strategy is appended to CREATE DATABASE. From PostgreSQL 15 the default (WAL_LOG)
	// writes the template through the WAL; FILE_COPY copies files and checkpoints, which
	// with fsync off is several times faster (about 30 ms against 200 ms).
	strategy string
}

// Main runs the tests, stops the cluster, checks for leaked goroutines and exits with the
// tests' exit code (or 1 if the teardown or the leak check failed).
func Main(m *testing.M) {
	mainRunning.Store(true)
	ignore := goleak.IgnoreCurrent()
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		code = max(code, 1)
	}
	if code == 0 {
		if err := goleak.Find(ignore); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Open returns a migrated *pg.DB on a fresh database, closed and dropped when t ends.
func Open(t testing.TB) *pg.DB {
	t.Helper()
	return OpenAt(t, NewDB(t))
}

// OpenAt returns a migrated *pg.DB on the database at url (from NewDB or NewDBWith), closed
// when t ends; tests that also look at the database directly keep url.
func OpenAt(t testing.TB, url string) *pg.DB {
	t.Helper()
	return OpenWith(t, pg.Config{URL: url})
}

// OpenWith is OpenAt with a configuration of the test's own: a pool of a given size, say.
func OpenWith(t testing.TB, cfg pg.Config) *pg.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	db, err := pg.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(db.Close) // registered after the drop, so it runs before it
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return db
}

// NewDB creates an empty database for t and returns its connection string. The database is
// dropped, with any sessions still connected to it, when t ends.
func NewDB(t testing.TB) (url string) {
	t.Helper()
	return NewDBWith(t, "")
}

// NewDBWith is NewDB with extra CREATE DATABASE options, such as a locale provider and
// locale, for tests of behaviour that depends on them.
func NewDBWith(t testing.TB, options string) (url string) {
	t.Helper()
	s := get(t)
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	if err := s.exec(ctx, `CREATE DATABASE "`+name+`" TEMPLATE template0`+s.strategy+" "+options); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := s.exec(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
			t.Errorf("pgtest: dropping database %s: %v", name, err)
		}
	})
	u, err := withDatabase(s.url, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

func (s *testServer) exec(ctx context.Context, sql string) error {
	return s.admin.Exec(ctx, sql)
}

func get(t testing.TB) *testServer {
	t.Helper()
	if !mainRunning.Load() {
		t.Fatal("pgtest: call pgtest.Main(m) from TestMain, so that the test cluster is stopped after the run")
	}
	mu.Lock()
	defer mu.Unlock()
	if server == nil {
		server = start()
	}
	if server.err != nil {
		t.Fatalf("pgtest: %v", server.err)
	}
	return server
}

func start() *testServer {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s := &testServer{url: os.Getenv(EnvURL)}
	if s.url == "" {
		s.err = s.startCluster(ctx)
		if s.err != nil {
			return s
		}
	}
	s.admin, s.err = rawsql.Connect(ctx, s.url)
	if s.err != nil {
		return s
	}
	var version int
	s.err = s.admin.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version)
	if version >= 150000 {
		s.strategy = " STRATEGY FILE_COPY"
	}
	return s
}

// startCluster starts a cluster under the temporary directory. When the tests run as root the
// server runs as another user, which must be able to enter the directory: MkdirTemp makes it
// 0700, so it is opened to 0711 (enter, not list).
func (s *testServer) startCluster(ctx context.Context) error {
	removeLeftovers(ctx)
	dir, err := clusterDir()
	s.dir = dir
	if err != nil {
		return err
	}
	s.cluster, err = localpg.Start(ctx, localpg.Config{DataDir: filepath.Join(dir, "pg"), Settings: clusterSettings})
	if err != nil {
		return fmt.Errorf("starting the test cluster: %w", err)
	}
	s.url = s.cluster.DSN()
	return nil
}

// clusterDir makes the temporary directory a cluster's data directory ("pg") goes in, named
// so that removeLeftovers finds it should the test process be killed.
func clusterDir() (string, error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", fmt.Errorf("creating the cluster's directory: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return dir, fmt.Errorf("opening %s to the server's user: %w", dir, err)
	}
	return dir, nil
}

func shutdown() error {
	mu.Lock()
	defer mu.Unlock()
	s := server
	server = nil
	if s == nil {
		return nil
	}
	if s.admin != nil {
		s.admin.Close()
	}
	var errs []error
	if s.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.cluster.Stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if s.dir != "" {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("removing the test cluster: %w", err))
		}
	}
	return errors.Join(errs...)
}

// removeLeftovers stops and removes clusters that killed test processes left behind. localpg
// recognises a server whose owner died and stops it at Start; a directory a live process still
// uses is skipped (ErrInUse), and young ones are skipped so that a process still setting its
// cluster up is not raced.
func removeLeftovers(ctx context.Context) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < leftoverMinAge {
			continue
		}
		c, err := localpg.Start(ctx, localpg.Config{DataDir: filepath.Join(dir, "pg"), Settings: clusterSettings})
		if err != nil {
			continue
		}
		if err := c.Stop(ctx); err == nil {
			_ = os.RemoveAll(dir)
		}
	}
}

var unsafeName = regexp.MustCompile(`[^a-z0-9]+`)

// dbName makes a database name from the test's name, which helps when reading
// pg_stat_activity, plus a random suffix for uniqueness across processes on a shared server.
func dbName(testName string) string {
	base := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(testName), "_"), "_")
	if len(base) > 40 {
		base = base[:40]
	}
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "t_" + base + "_" + hex.EncodeToString(b[:])
}

// withDatabase points a connection string, URL or keyword/value form, at another database.
// WithParam returns the connection string connString (from NewDB) with the parameter key
// set to value, for tests that need a pgx setting such as default_query_exec_mode.
func WithParam(t testing.TB, connString, key, value string) string {
	t.Helper()
	if !isURI(connString) {
		// A later keyword overrides an earlier one.
		return connString + " " + key + "=" + value
	}
	u, err := url.Parse(connString)
	if err != nil {
		t.Fatalf("pgtest: parsing %s: %v", connString, err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func isURI(connString string) bool {
	return strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://")
}

func withDatabase(connString, name string) (string, error) {
	if isURI(connString) {
		u, err := url.Parse(connString)
		if err != nil {
			return "", fmt.Errorf("parsing %s: %w", EnvURL, err)
		}
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		u.Path = "/" + name
		return u.String(), nil
	}
	// A later keyword overrides an earlier one.
	return connString + " dbname=" + name, nil
}
