package localpg

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// helperEnv makes the test binary act as a jetgres that starts a cluster and then waits to be
// killed, for the orphan test.
const helperEnv = "LOCALPG_TEST_HELPER_DATA_DIR"

var testSettings = map[string]string{"fsync": "off", "shared_buffers": "32MB"}

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		runHelper(dir)
	}
	goleak.VerifyTestMain(m)
}

func runHelper(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{DataDir: dir, Settings: testSettings})
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("ready %d\n", c.current().pid())
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// dataDir returns a cluster directory under t.TempDir(). The testing package makes the
// directory above it 0700, which a server running as another user (when the tests run as root)
// cannot enter.
func dataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "pg")
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func start(t *testing.T, dir string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{DataDir: dir, Settings: testSettings, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func stop(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// query runs one single-row query on the cluster, on a connection of the test's own.
func query(t *testing.T, c *Cluster, sql string, dest ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	db, err := rawsql.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatalf("rawsql.Connect(%s): %v", c.DSN(), err)
	}
	defer db.Close()
	if len(dest) == 0 {
		err = db.Exec(ctx, sql)
	} else {
		err = db.QueryRow(ctx, sql).Scan(dest...)
	}
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestStartStopRestart(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)

	began := time.Now()
	c := start(t, dir)
	t.Logf("first start (initdb, create database, start): %v", time.Since(began))

	var user, db, version string
	query(t, c, `SELECT current_user, current_database(), current_setting('server_version_num')`, &user, &db, &version)
	if user != Superuser || db != Database {
		t.Errorf("connected as %s to %s, want %s to %s", user, db, Superuser, Database)
	}
	var listen, socketPerm string
	query(t, c, `SELECT current_setting('listen_addresses'), current_setting('unix_socket_permissions')`, &listen, &socketPerm)
	if listen != "" || socketPerm != "0700" {
		t.Errorf("listen_addresses=%q unix_socket_permissions=%q, want no TCP and 0700", listen, socketPerm)
	}
	if c.SocketDir() != dir {
		t.Errorf("SocketDir() = %s, want %s", c.SocketDir(), dir)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data directory mode = %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	query(t, c, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')`)

	stop(t, c)
	if err := c.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, pidFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("postmaster.pid after a clean stop: %v", err)
	}

	began = time.Now()
	c = start(t, dir)
	t.Logf("restart of an existing cluster: %v", time.Since(began))
	var v string
	query(t, c, `SELECT v FROM kept`, &v)
	if v != "still here" {
		t.Errorf("after restart kept.v = %q", v)
	}
	stop(t, c)
}

// TestOrphanRecovery kills a jetgres (a helper process) with SIGKILL, which leaves its
// PostgreSQL running; the next Start must stop that orphan and start a fresh server.
func TestOrphanRecovery(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperEnv+"="+dir)
	stdin, err := helper.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	var orphan int
	select {
	case l := <-line:
		pid, ok := strings.CutPrefix(l, "ready ")
		if !ok {
			t.Fatalf("helper: %q", l)
		}
		orphan, _ = strconv.Atoi(pid)
	case <-time.After(time.Minute):
		t.Fatal("helper did not report its cluster ready within a minute")
	}
	t.Cleanup(func() {
		if !processGone(orphan) {
			_ = syscall.Kill(-orphan, syscall.SIGKILL)
		}
	})
	_ = helper.Process.Kill()
	_ = helper.Wait()
	if processGone(orphan) {
		t.Fatalf("postmaster %d died with its parent; the test needs it to survive", orphan)
	}

	c := start(t, dir)
	if !processGone(orphan) {
		t.Errorf("orphaned postmaster %d still running after Start", orphan)
	}
	if c.current().pid() == orphan {
		t.Errorf("Start reused the orphan")
	}
	var one int
	query(t, c, `SELECT 1`, &one)
	stop(t, c)
}

// TestStalePidFile covers a pid file whose PID is dead, which PostgreSQL would ignore by
// itself, and one whose PID now belongs to an unrelated live process of the cluster's user,
// which PostgreSQL would take for a running postmaster and refuse to start.
func TestStalePidFile(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	c := start(t, dir)
	stop(t, c)
	u, err := resolveUser("")
	if err != nil {
		t.Fatal(err)
	}

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	unrelated := exec.Command("sleep", "60")
	unrelated.SysProcAttr = &syscall.SysProcAttr{Credential: u.cred}
	if err := unrelated.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unrelated.Process.Kill()
		_ = unrelated.Wait()
	})

	for what, pid := range map[string]int{"dead": dead.Process.Pid, "reused": unrelated.Process.Pid} {
		stale := fmt.Sprintf("%d\n%s\n0\n5432\n%s\n\n0 0\nready   \n", pid, dir, dir)
		if err := os.WriteFile(filepath.Join(dir, pidFileName), []byte(stale), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(dir, pidFileName), int(u.uid), int(u.gid)); err != nil && u.cred != nil {
			t.Fatal(err)
		}
		c = start(t, dir)
		var one int
		query(t, c, `SELECT 1`, &one)
		stop(t, c)
		if processGone(unrelated.Process.Pid) {
			t.Fatalf("%s PID: Start stopped the unrelated process", what)
		}
	}
}

func TestInUse(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	c := start(t, dir)
	_, err := Start(t.Context(), Config{DataDir: dir})
	if !errors.Is(err, ErrInUse) {
		t.Errorf("second Start on a running cluster: %v, want ErrInUse", err)
	}
	stop(t, c)
}

func TestCrashIsReported(t *testing.T) {
	t.Parallel()
	c := start(t, dataDir(t))
	if err := syscall.Kill(-c.current().pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done not closed 30s after the server was killed")
	}
	if c.Err() == nil {
		t.Error("Err() = nil after a crash")
	}
	if err := c.Stop(t.Context()); err == nil || !strings.Contains(err.Error(), "already exited") {
		t.Errorf("Stop after a crash: %v", err)
	}
}

func TestMissingBinaries(t *testing.T) {
	t.Parallel()
	_, err := Start(t.Context(), Config{DataDir: dataDir(t), BinDir: t.TempDir()})
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("Start with an empty BinDir: %v, want ErrNoBinaries", err)
	}
	if !strings.Contains(err.Error(), "Config.BinDir") {
		t.Errorf("error %q does not name Config.BinDir, which was set", err)
	}
}

func TestUntraversableParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root runs the server as another user")
	}
	t.Parallel()
	open := dataDir(t)
	closed := filepath.Join(filepath.Dir(open), "closed")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	c, err := Start(t.Context(), Config{DataDir: filepath.Join(closed, "pg")})
	if err == nil {
		_ = c.Stop(context.Background())
	}
	if err == nil || !strings.Contains(err.Error(), "cannot enter "+closed+" ") {
		t.Errorf("Start under a 0700 root directory: %v, want an error naming it", err)
	}
	var ae *AccessError
	if !errors.As(err, &ae) || ae.Dir != closed || ae.Mode != 0o700 {
		t.Errorf("Start under a 0700 root directory: %#v, want an *AccessError for %s", err, closed)
	}
	// The first advice is to move the data directory, not to open up the one above it.
	if msg := err.Error(); strings.Index(msg, "choose a data directory") > strings.Index(msg, "chmod") {
		t.Errorf("error %q advises chmod before another data directory", msg)
	}
	// Nothing was created: no lock file, and no directory for one, as the start it failed.
	deep := filepath.Join(closed, "jetgres-data", "pg")
	if _, err := Start(t.Context(), Config{DataDir: deep}); !errors.As(err, &ae) {
		t.Errorf("Start in a new directory under a 0700 root directory: %v, want an *AccessError", err)
	}
	for _, p := range []string{filepath.Join(closed, "pg.lock"), filepath.Join(closed, "jetgres-data")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a failed start left %s behind (%v)", p, err)
		}
	}
}

func TestRefusesPrivacySettings(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"listen_addresses", "port", "unix_socket_directories", "Unix_Socket_Permissions"} {
		_, err := Start(t.Context(), Config{DataDir: dataDir(t), Settings: map[string]string{name: "x"}})
		if err == nil || !strings.Contains(err.Error(), strings.ToLower(name)) {
			t.Errorf("Settings{%s}: %v, want an error naming it", name, err)
		}
	}
}

func TestDSNQuoting(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/jetgres/pg": "/var/lib/jetgres/pg",
		"/a b/it's":           `'/a b/it\'s'`,
	} {
		if got := quoteDSNValue(in); got != want {
			t.Errorf("quoteDSNValue(%q) = %s, want %s", in, got, want)
		}
	}
}

// A clean stop logs nothing above info: the lines with which PostgreSQL ends its sessions and
// background workers during a fast shutdown that Stop asked for are routine. The same line
// outside a stop, a session ended by pg_terminate_backend, stays a warning.
func TestCleanStopWarnsAboutNothing(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{DataDir: dataDir(t), Settings: testSettings,
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(logs, tWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	db, err := rawsql.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	victim, err := rawsql.Connect(ctx, c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	var pid int
	if err := victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(ctx, fmt.Sprintf(`SELECT pg_terminate_backend(%d)`, pid)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if !strings.Contains(logs.String(), "level=WARN msg=\"terminating connection due to administrator command\"") {
			return errors.New("the terminated session was not logged as a warning")
		}
		return nil
	})

	before := len(logs.String())
	// A session still open when the stop begins is ended the same way.
	stop(t, c)
	for line := range strings.Lines(logs.String()[before:]) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("a clean stop logged: %s", line)
		}
	}
}
