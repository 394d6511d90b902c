package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/jetgres/jetgres/internal/testwait"
)

// goRunTimeout covers compiling jetgres for `go run` on a busy machine, and its first start.
const goRunTimeout = 5 * time.Minute

// TestGoRunStopsWithTheGoCommand runs jetgres the way the README does, `go run ./cmd/jetgres`,
// and sends SIGTERM to the go command alone, as a supervisor or `kill <pid>` would. The go
// command does not pass it on; jetgres must notice its parent is gone and stop gracefully,
// its PostgreSQL included, rather than run on orphaned.
func TestGoRunStopsWithTheGoCommand(t *testing.T) {
	t.Parallel()
	dir := newDataDir(t)
	readyFile := filepath.Join(dir, "ready.json")
	// A file, not a pipe: the go command's Wait would otherwise wait for jetgres too, which
	// inherits the descriptor.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	goRun := exec.Command("go", "run", "./cmd/jetgres", "serve",
		"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "data"), "--ready-file", readyFile, "--log-level", "debug")
	goRun.Dir = ".."
	goRun.Env = cleanEnv()
	goRun.Stdout, goRun.Stderr = logFile, logFile
	if err := goRun.Start(); err != nil {
		t.Fatal(err)
	}
	goExited := make(chan error, 1)
	go func() { goExited <- goRun.Wait() }()
	jetgresPID := 0
	t.Cleanup(func() {
		_ = goRun.Process.Kill()
		<-goExited
		if jetgresPID != 0 && !processGone(jetgresPID) {
			_ = syscall.Kill(jetgresPID, syscall.SIGTERM)
			testwait.For(t, stopTimeout, func() error {
				if !processGone(jetgresPID) {
					return fmt.Errorf("jetgres (pid %d) still running", jetgresPID)
				}
				return nil
			})
		}
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("go run output:\n%s", b)
		}
	})

	testwait.For(t, goRunTimeout, func() error {
		select {
		case err := <-goExited:
			goExited <- err
			t.Fatalf("go run exited before jetgres was ready: %v", err)
		default:
		}
		b, err := os.ReadFile(readyFile)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, new(struct{ NATS, HTTP string }))
	})
	jetgresPID = childNamed(t, goRun.Process.Pid, "jetgres")
	if len(postgresProcesses(t, dir)) == 0 {
		t.Fatalf("no postgres process found in %s while jetgres runs", dir)
	}

	if err := goRun.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-goExited:
		goExited <- nil
	case <-time.After(stopTimeout):
		t.Fatal("the go command did not exit on SIGTERM")
	}
	testwait.For(t, stopTimeout, func() error {
		if !processGone(jetgresPID) {
			return fmt.Errorf("jetgres (pid %d) still runs after the go command exited", jetgresPID)
		}
		return nil
	})
	requireNoPostgres(t, dir)
	logs, err := os.ReadFile(logFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(logs, []byte(`msg="jetgres stopped"`)) {
		t.Errorf("jetgres did not stop gracefully:\n%s", logs)
	}
}

// childNamed returns the pid of parent's child process whose command is name.
func childNamed(t testing.TB, parent int, name string) int {
	t.Helper()
	procs, err := procfs.AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PPID == parent && st.Comm == name {
			return p.PID
		}
	}
	t.Fatalf("process %d has no child named %s", parent, name)
	return 0
}

// processGone reports whether pid has exited; a zombie that nobody has reaped yet counts.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// TestQuietStartAndStop: at the default log level, a start with the private PostgreSQL and a
// clean stop log no warnings, so that the first warning a newcomer sees means something.
func TestQuietStartAndStop(t *testing.T) {
	t.Parallel()
	j := startJetgres(t, options{Args: []string{"--log-level", "info"}})
	corePubSub(t, j, "e2e.quiet", "hello")
	j.stop(t)
	for line := range strings.Lines(j.logs.String()) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("logged at a start and a clean stop: %s", line)
		}
	}
}

// TestReadmeQuickStartInstallsNatsFirst: the Quick start says how to install the nats CLI, at
// the version the tests use, before its first nats command.
func TestReadmeQuickStartInstallsNatsFirst(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, quick, ok := strings.Cut(string(readme), "\n## Quick start\n")
	if !ok {
		t.Fatal("README has no Quick start section")
	}
	quick, _, _ = strings.Cut(quick, "\n## ")
	install := strings.Index(quick, "go install github.com/nats-io/natscli/nats@"+natsCLIVersion)
	if install < 0 {
		t.Fatalf("the Quick start does not say how to install the nats CLI %s", natsCLIVersion)
	}
	for line := range strings.Lines(quick) {
		if strings.HasPrefix(line, "nats ") {
			if first := strings.Index(quick, line); first < install {
				t.Errorf("the Quick start runs %q before it says how to install nats", strings.TrimSpace(line))
			}
			break
		}
	}
}
