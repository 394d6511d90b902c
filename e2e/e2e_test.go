// Package e2e tests jetgres from the outside: the real binary, started as a process with its
// private PostgreSQL or a given one, driven by real clients such as the nats CLI and nats.go.
//
// This file is the harness every end-to-end test shares: the jetgres binary and the nats CLI
// are built once per test process, and each test starts its own jetgres on free ports.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/syncbuf"
	"github.com/jetgres/jetgres/internal/testwait"

	"go.uber.org/goleak"
)

const (
	// natsCLIVersion is the natscli release the tests and the README are written against.
	natsCLIVersion = "v0.5.0"

	// startTimeout covers a first start: initdb, a race-enabled binary, a busy CI machine.
	startTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
)

// workDir holds everything the test process builds and every data directory. It is made
// traversable by others because jetgres running as root starts PostgreSQL as an
// unprivileged user, who must be able to reach its data directory below it.
var workDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "jetgres-e2e-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	workDir = dir
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: cleaning up: %v\n", err)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: leaked goroutines: %v\n", err)
			return 1
		}
	}
	return code
}

// built runs build at most once per test process and hands every caller its result.
type built struct {
	once sync.Once
	path string
	err  error
}

func (b *built) get(t testing.TB, build func() (string, error)) string {
	t.Helper()
	b.once.Do(func() { b.path, b.err = build() })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

var jetgresBin, natsBin built

// jetgresBinary builds cmd/jetgres once, with the race detector when the tests have it.
func jetgresBinary(t testing.TB) string {
	return jetgresBin.get(t, func() (string, error) {
		out := filepath.Join(workDir, "bin", "jetgres")
		args := []string{"build", "-o", out}
		if raceEnabled() {
			args = append(args, "-race")
		}
		args = append(args, "github.com/jetgres/jetgres/cmd/jetgres")
		cmd := exec.Command("go", args...)
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return out, nil
	})
}

func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// natsCLI finds the nats CLI at natsCLIVersion in PATH or GOPATH/bin, or else installs it
// into the test process's own directory.
func natsCLI(t testing.TB) string {
	return natsBin.get(t, func() (string, error) {
		var candidates []string
		if p, err := exec.LookPath("nats"); err == nil {
			candidates = append(candidates, p)
		}
		if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			for _, dir := range filepath.SplitList(strings.TrimSpace(string(gopath))) {
				candidates = append(candidates, filepath.Join(dir, "bin", "nats"))
			}
		}
		for _, p := range candidates {
			if out, err := exec.Command(p, "--version").Output(); err == nil && strings.TrimSpace(string(out)) == natsCLIVersion {
				return p, nil
			}
		}
		gobin := filepath.Join(workDir, "natscli")
		cmd := exec.Command("go", "install", "github.com/nats-io/natscli/nats@"+natsCLIVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("installing the nats CLI %s: %v\n%s", natsCLIVersion, err, b)
		}
		return filepath.Join(gobin, "nats"), nil
	})
}

// newDataDir returns a fresh, empty directory for one jetgres's --data-dir.
func newDataDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp(workDir, "data-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// options say how to start one jetgres.
type options struct {
	// DataDir is --data-dir; empty means a fresh one.
	DataDir string
	// Args are added after the harness's own flags, so they win.
	Args []string
	// Env is added to a clean environment: no JETGRES_* or DATABASE_URL from outside.
	Env []string
}

// jetgres is one running (or exited) jetgres process.
type jetgres struct {
	cmd       *exec.Cmd
	logs      *syncbuf.Buffer
	exited    chan struct{}
	waitErr   error
	dataDir   string
	readyFile string

	natsURL  string
	httpAddr string
}

// startJetgres starts jetgres and returns once its /readyz answers 200.
func startJetgres(t testing.TB, o options) *jetgres {
	t.Helper()
	j := launchJetgres(t, o)
	j.waitReady(t)
	return j
}

// launchJetgres starts jetgres on free loopback ports without waiting for it.
func launchJetgres(t testing.TB, o options) *jetgres {
	t.Helper()
	bin := jetgresBinary(t)
	if o.DataDir == "" {
		o.DataDir = newDataDir(t)
	}
	readyFile := filepath.Join(t.TempDir(), "ready.json")
	args := append([]string{
		"serve",
		"--listen", "127.0.0.1:0",
		"--http", "127.0.0.1:0",
		"--data-dir", o.DataDir,
		"--ready-file", readyFile,
		"--log-level", "debug",
	}, o.Args...)
	j := &jetgres{
		cmd:       exec.Command(bin, args...),
		logs:      &syncbuf.Buffer{},
		exited:    make(chan struct{}),
		dataDir:   o.DataDir,
		readyFile: readyFile,
	}
	j.cmd.Env = append(cleanEnv(), o.Env...)
	j.cmd.Stdout = j.logs
	j.cmd.Stderr = j.logs
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("start jetgres: %v", err)
	}
	go func() {
		j.waitErr = j.cmd.Wait()
		close(j.exited)
	}()
	t.Cleanup(func() {
		if !j.hasExited() {
			_ = j.cmd.Process.Kill()
			<-j.exited
		}
		if t.Failed() {
			t.Logf("jetgres output:\n%s", j.logs.String())
		}
	})
	return j
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "JETGRES_") || strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "PG") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (j *jetgres) hasExited() bool {
	select {
	case <-j.exited:
		return true
	default:
		return false
	}
}

// waitReady waits for the ready file and then for /readyz to answer 200.
func (j *jetgres) waitReady(t testing.TB) {
	t.Helper()
	testwait.For(t, startTimeout, func() error {
		if j.hasExited() {
			t.Fatalf("jetgres exited before it was ready: %v", j.waitErr)
		}
		if j.httpAddr == "" {
			b, err := os.ReadFile(j.readyFile)
			if err != nil {
				return fmt.Errorf("jetgres not ready: %w", err)
			}
			var r struct{ NATS, HTTP string }
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("ready file %q: %v", b, err)
			}
			j.natsURL, j.httpAddr = r.NATS, r.HTTP
		}
		code, _, err := j.get("/readyz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/readyz answered %d", code)
		}
		return err
	})
}

// httpClient keeps no idle connections, which would outlive the jetgres they point at and
// show up as leaked goroutines.
var httpClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// get fetches a path from jetgres's HTTP endpoint.
func (j *jetgres) get(path string) (int, string, error) {
	resp, err := httpClient.Get("http://" + j.httpAddr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// mustGet is get for tests that need the answer.
func (j *jetgres) mustGet(t testing.TB, path string) (int, string) {
	t.Helper()
	code, body, err := j.get(path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return code, body
}

// stop sends SIGTERM and waits for jetgres to exit, failing the test if it does not exit,
// or exits with an error.
func (j *jetgres) stop(t testing.TB) {
	t.Helper()
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SIGTERM: %v", err)
	}
	if err := j.wait(stopTimeout); err != nil {
		t.Fatalf("jetgres after SIGTERM: %v", err)
	}
}

// kill stops jetgres with SIGKILL, leaving whatever it started to fend for itself.
func (j *jetgres) kill(t testing.TB) {
	t.Helper()
	if err := j.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-j.exited
}

// wait waits up to timeout for jetgres to exit and returns how it exited.
func (j *jetgres) wait(timeout time.Duration) error {
	select {
	case <-j.exited:
		return j.waitErr
	case <-time.After(timeout):
		_ = j.cmd.Process.Kill()
		<-j.exited
		return fmt.Errorf("did not exit within %v; killed", timeout)
	}
}

// natsCmd returns the nats CLI pointed at this jetgres, with a configuration directory of
// its own so that no saved context of the machine's user applies.
func (j *jetgres) natsCmd(t testing.TB, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	return natsCmdAt(t, ctx, j.natsURL, args...)
}

// natsCmdAt is natsCmd for any NATS server: jetgres, or the JetStream a test compares it with.
func natsCmdAt(t testing.TB, ctx context.Context, url string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, natsCLI(t), append([]string{"--server", url}, args...)...)
	cfg := t.TempDir()
	cmd.Env = append(cleanEnv(), "XDG_CONFIG_HOME="+cfg, "HOME="+cfg, "NATS_CONTEXT=")
	return cmd
}

// postgresProcesses lists the postgres processes working in dir: the postmaster and its
// children all run with the data directory as their working directory.
func postgresProcesses(t testing.TB, dir string) []int {
	t.Helper()
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		cwd, _ := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if within(cwd, dir) || bytes.Contains(cmdline, []byte(dir)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+string(filepath.Separator))
}

// requireNoPostgres fails the test if a postgres process still works in dir after a short
// grace period, which lets the children of a stopped postmaster finish exiting.
func requireNoPostgres(t testing.TB, dir string) {
	t.Helper()
	testwait.For(t, 10*time.Second, func() error {
		var still []string
		for _, pid := range postgresProcesses(t, dir) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			still = append(still, fmt.Sprintf("%d: %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
		if len(still) > 0 {
			return fmt.Errorf("postgres processes still running in %s:\n%s", dir, strings.Join(still, "\n"))
		}
		return nil
	})
}
