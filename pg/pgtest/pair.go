package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// PairConfig configures StartPair.
type PairConfig struct {
	// Synchronous makes the standby synchronous (synchronous_standby_names = '*' on the
	// primary): a commit is answered once the standby has written it, so promoting the
	// standby loses nothing that was answered. Otherwise the standby is asynchronous, and
	// DetachStandby lets the primary commit what the standby never receives.
	Synchronous bool
}

// PrimaryStandby is a PostgreSQL primary and a hot standby that streams its WAL, for tests of a
// promotion: the primary killed or shut down, the standby promoted in its place. Each is a
// cluster of its own, started with localpg as the shared test cluster is (as an unprivileged
// user when the tests run as root), the standby made from the primary with pg_basebackup -R.
// Unlike the shared cluster, the primary waits for its WAL to be flushed
// (synchronous_commit = on), which synchronous replication needs. Each server is reached on
// a TCP address of its own through a Proxy, so that URL can name both as a client of a
// replicated PostgreSQL does. Everything is stopped and removed when the test ends. A PrimaryStandby
// needs no Main.
type PrimaryStandby struct {
	t       testing.TB
	primary *pairNode
	standby *pairNode
}

type pairNode struct {
	dir     string // the temporary directory; the data directory is dir/pg
	cluster *localpg.Cluster
	proxy   *Proxy
	killed  bool
}

// pairSettings are the shared cluster's, but for what replication and its tests need: the
// primary waits for its commits to be flushed (and, when the standby is synchronous, to
// reach the standby), and keeps WAL for a standby that falls behind; a standby whose
// primary went away tries again within 100 ms rather than 5 s, which a promotion asked for
// meanwhile was once seen to wait for.
var pairSettings = func() map[string]string {
	s := maps.Clone(clusterSettings)
	s["synchronous_commit"] = "on"
	s["full_page_writes"] = "on"
	s["wal_keep_size"] = "512MB"
	s["wal_retrieve_retry_interval"] = "100ms"
	return s
}()

const pairWait = time.Minute

// StartPair starts a primary and a streaming standby of it and returns once the standby
// streams (and, with cfg.Synchronous, is the primary's synchronous standby).
func StartPair(t testing.TB, cfg PairConfig) *PrimaryStandby {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	removeLeftovers(ctx)
	p := &PrimaryStandby{t: t}
	var err error
	if p.primary, err = startPairNode(t, ctx, nil); err != nil {
		t.Fatalf("pgtest: starting the primary: %v", err)
	}
	if p.standby, err = startPairNode(t, ctx, p.primary); err != nil {
		t.Fatalf("pgtest: starting the standby: %v", err)
	}
	if err := p.waitPrimary(ctx, `SELECT count(*) = 1 FROM pg_stat_replication WHERE state = 'streaming'`); err != nil {
		t.Fatalf("pgtest: waiting for the standby to stream: %v", err)
	}
	if cfg.Synchronous {
		if err := p.execPrimary(ctx, `ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`); err != nil {
			t.Fatalf("pgtest: making the standby synchronous: %v", err)
		}
		if err := p.waitPrimary(ctx, `SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'`); err != nil {
			t.Fatalf("pgtest: waiting for the standby to be synchronous: %v", err)
		}
	}
	return p
}

// startPairNode starts a cluster in a directory of its own: a fresh primary, or, from, a
// standby made from from's base backup. pg_basebackup runs as the test's user, and
// localpg.Start gives the files to the server's user, as it does at every start.
func startPairNode(t testing.TB, ctx context.Context, from *pairNode) (*pairNode, error) {
	dir, err := clusterDir()
	n := &pairNode{dir: dir}
	t.Cleanup(func() { n.stop(t) })
	if err != nil {
		return n, err
	}
	dataDir := filepath.Join(dir, "pg")
	if from != nil {
		cmd := exec.CommandContext(ctx, filepath.Join(from.cluster.BinDir(), "pg_basebackup"),
			"-D", dataDir, "-h", from.cluster.SocketDir(), "-p", "5432", "-U", localpg.Superuser,
			"--write-recovery-conf", "--wal-method=stream", "--checkpoint=fast", "--no-sync")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C"}
		if out, err := cmd.CombinedOutput(); err != nil {
			return n, fmt.Errorf("pg_basebackup: %w: %s", err, strings.TrimSpace(string(out)))
		}
		// The primary's socket is in its data directory, and so the lock file of its socket
		// came with the backup: the standby would take it for a live server's.
		if err := os.Remove(filepath.Join(dataDir, ".s.PGSQL.5432.lock")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, err
		}
	}
	n.cluster, err = localpg.Start(ctx, localpg.Config{DataDir: dataDir, Settings: pairSettings})
	if err != nil {
		return n, err
	}
	n.proxy = NewProxy(t, n.cluster.DSN())
	return n, nil
}

// stop stops the node's server, unless it was killed, and removes its directory.
func (n *pairNode) stop(t testing.TB) {
	if n.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), pairWait)
		defer cancel()
		if err := n.cluster.Stop(ctx); err != nil && !n.killed {
			t.Errorf("pgtest: stopping a cluster of the pair: %v", err)
		}
	}
	if n.dir != "" {
		if err := os.RemoveAll(n.dir); err != nil {
			t.Errorf("pgtest: removing a cluster of the pair: %v", err)
		}
	}
}

// URL is the connection string of the jetgres database on both servers, the primary first,
// with target_session_attrs=read-write: a client connects to whichever accepts writes.
func (p *PrimaryStandby) URL() string {
	return fmt.Sprintf("postgres://%s@%s,%s/%s?sslmode=disable&target_session_attrs=read-write",
		localpg.Superuser, p.primary.proxy.Addr(), p.standby.proxy.Addr(), localpg.Database)
}

// PrimaryDSN and StandbyDSN reach one server each, directly, for the test's own queries.
func (p *PrimaryStandby) PrimaryDSN() string { return p.primary.cluster.DSN() }

// StandbyDSN is the standby's connection string; after Promote, the new primary's.
func (p *PrimaryStandby) StandbyDSN() string { return p.standby.cluster.DSN() }

// KillPrimary kills the primary's postmaster and every process it started with SIGKILL, as
// a machine that dies takes them all at once, and returns once the postmaster is gone. Each
// of PostgreSQL's processes is the leader of a process group of its own, so they are found
// by their parent; the postmaster is stopped first, so that it starts none meanwhile, and
// all are stopped before any is killed, so that none sees another die and does anything
// about it.
func (p *PrimaryStandby) KillPrimary() {
	p.t.Helper()
	n := p.primary
	n.killed = true
	pid := n.cluster.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		p.t.Fatalf("pgtest: stopping the primary: %v", err)
	}
	procs := append(childPIDs(pid), pid)
	for _, c := range procs {
		_ = syscall.Kill(c, syscall.SIGSTOP)
	}
	for _, c := range procs {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	select {
	case <-n.cluster.Done():
	case <-time.After(pairWait):
		p.t.Fatalf("pgtest: the primary survived SIGKILL for %v", pairWait)
	}
}

// StopPrimary shuts the primary down as a planned switchover does: a fast shutdown, which
// ends every session and, before it exits, sends the standby all of its WAL.
func (p *PrimaryStandby) StopPrimary() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pairWait)
	defer cancel()
	if err := p.primary.cluster.Stop(ctx); err != nil {
		p.t.Fatalf("pgtest: stopping the primary: %v", err)
	}
}

// DetachStandby makes the standby stop receiving the primary's WAL (its primary_conninfo
// emptied), so that what the primary commits from now on is lost if the standby is promoted.
func (p *PrimaryStandby) DetachStandby() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pairWait)
	defer cancel()
	if err := execOn(ctx, p.StandbyDSN(), `ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`); err != nil {
		p.t.Fatalf("pgtest: detaching the standby: %v", err)
	}
	if err := waitOn(ctx, p.StandbyDSN(), `SELECT count(*) = 0 FROM pg_stat_wal_receiver`); err != nil {
		p.t.Fatalf("pgtest: waiting for the standby to stop receiving: %v", err)
	}
}

// CatchUp returns once the standby has replayed everything the primary has written.
func (p *PrimaryStandby) CatchUp() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pairWait)
	defer cancel()
	var lsn string
	err := withDB(ctx, p.PrimaryDSN(), func(db *rawsql.Pool) error {
		return db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	})
	if err == nil {
		err = waitOn(ctx, p.StandbyDSN(), `SELECT pg_last_wal_replay_lsn() >= '`+lsn+`'::pg_lsn`)
	}
	if err != nil {
		p.t.Fatalf("pgtest: waiting for the standby to catch up: %v", err)
	}
}

// Promote promotes the standby (pg_promote, waiting for it) and returns when it accepts
// writes, with the times it was asked to and found done: pg_promote looks every 100 ms
// whether the promotion is done, so the new primary may have taken writes up to that long
// before done.
func (p *PrimaryStandby) Promote() (asked, done time.Time) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pairWait)
	defer cancel()
	var ok bool
	asked = time.Now()
	err := withDB(ctx, p.StandbyDSN(), func(db *rawsql.Pool) error {
		return db.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok)
	})
	if err == nil && !ok {
		err = errors.New("pg_promote did not finish within 60 s")
	}
	if err != nil {
		p.t.Fatalf("pgtest: promoting the standby: %v", err)
	}
	return asked, time.Now()
}

func (p *PrimaryStandby) execPrimary(ctx context.Context, stmts ...string) error {
	return execOn(ctx, p.PrimaryDSN(), stmts...)
}

func (p *PrimaryStandby) waitPrimary(ctx context.Context, cond string) error {
	return waitOn(ctx, p.PrimaryDSN(), cond)
}

func withDB(ctx context.Context, dsn string, fn func(db *rawsql.Pool) error) error {
	db, err := rawsql.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(db)
}

func execOn(ctx context.Context, dsn string, stmts ...string) error {
	return withDB(ctx, dsn, func(db *rawsql.Pool) error {
		for _, s := range stmts {
			if err := db.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
}

// waitOn polls cond, a query of one boolean, until it holds or ctx ends. A query that fails
// is tried again: on a standby, what it names may not have arrived yet.
func waitOn(ctx context.Context, dsn, cond string) error {
	return withDB(ctx, dsn, func(db *rawsql.Pool) error {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			var ok bool
			err := db.QueryRow(ctx, cond).Scan(&ok)
			if err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %w (last error: %v)", cond, ctx.Err(), err)
			case <-t.C:
			}
		}
	})
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(pid int) []int {
	procs, _ := procfs.AllProcs()
	var out []int
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out
}
