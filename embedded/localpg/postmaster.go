package localpg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// pidFile is what PostgreSQL writes to postmaster.pid: line 1 the PID, line 2 the data
// directory, line 8 the status ("starting", "ready", "stopping"), which is how pg_ctl -w waits.
type pidFile struct {
	pid     int
	dataDir string
	status  string
}

const pidFileName = "postmaster.pid"

// pollInterval paces the waits on the pid file and on process exit. They are bounded by a
// context deadline, not by a number of polls.
const pollInterval = 20 * time.Millisecond

func readPidFile(dataDir string) (pidFile, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, pidFileName))
	if err != nil {
		return pidFile{}, err
	}
	lines := strings.Split(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		// The server writes the file in one go, so a torn read is a file being written right now.
		return pidFile{}, fmt.Errorf("%s: no PID on its first line", filepath.Join(dataDir, pidFileName))
	}
	pf := pidFile{pid: pid}
	if len(lines) > 1 {
		pf.dataDir = strings.TrimSpace(lines[1])
	}
	if len(lines) > 7 {
		pf.status = strings.TrimSpace(lines[7])
	}
	return pf, nil
}

// processGone reports whether pid has exited. A zombie counts as gone: once we have stopped an
// orphan it belongs to whatever adopted it, which may be slow to reap it, or never do so.
func processGone(pid int) bool {
	err := syscall.Kill(pid, 0)
	if errors.Is(err, syscall.ESRCH) {
		return true
	}
	p, err := procfs.NewProc(pid)
	if err != nil {
		return false
	}
	st, err := p.Stat()
	return err == nil && st.State == "Z"
}

// isPostmasterOf reports whether pid is a live PostgreSQL server for dataDir. On Linux the
// postmaster's working directory is its data directory, which tells it apart from an unrelated
// process that reused a stale PID. Without /proc we can only trust the pid file.
func isPostmasterOf(pid int, dataDir string) bool {
	if processGone(pid) {
		return false
	}
	if _, err := os.Stat("/proc/self/cwd"); err != nil {
		return true
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return false
	}
	want, err := filepath.EvalSymlinks(dataDir)
	if err != nil {
		want = dataDir
	}
	return cwd == want
}

// clearPidFile deals with a postmaster.pid left by an earlier run. The caller holds the data
// directory's lock, so no live jetgres owns a server there: a running server is an orphan whose
// jetgres died, and is stopped; a file naming a dead (or reused) PID is stale, and is removed.
// PostgreSQL ignores a stale file by itself when the PID is dead, but not when the PID now
// belongs to an unrelated live process of the same user.
func (c *Cluster) clearPidFile(ctx context.Context) error {
	pf, err := readPidFile(c.dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !isPostmasterOf(pf.pid, c.dataDir) {
		c.log.Info("removing stale PostgreSQL pid file", "pid", pf.pid, "data_dir", c.dataDir)
		if err := os.Remove(filepath.Join(c.dataDir, pidFileName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing stale pid file: %w", err)
		}
		return nil
	}
	c.log.Warn("stopping a PostgreSQL server left running by an earlier jetgres (fast shutdown)",
		"pid", pf.pid, "data_dir", c.dataDir)
	gone := func() bool { return processGone(pf.pid) }
	if err := shutdown(ctx, pf.pid, gone, waitPoll(gone)); err != nil {
		return fmt.Errorf("stopping orphaned PostgreSQL server (pid %d): %w", pf.pid, err)
	}
	// An orphan stopped with SIGQUIT or SIGKILL leaves its pid file behind.
	if err := os.Remove(filepath.Join(c.dataDir, pidFileName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing pid file of stopped orphan: %w", err)
	}
	return nil
}

// quitGrace is how long an immediate shutdown (SIGQUIT) may take before the process group is
// killed. Immediate shutdown does no checkpoint, so it is quick unless the machine is stuck.
const quitGrace = 5 * time.Second

// shutdown stops the postmaster pid: fast shutdown (SIGINT: roll back open transactions,
// disconnect clients, checkpoint) until ctx is done, then immediate shutdown (SIGQUIT, crash
// recovery at the next start), then SIGKILL to its whole process group. It returns nil only for
// a fast shutdown that finished in time. wait blocks until the process is gone or the given
// channel is closed.
func shutdown(ctx context.Context, pid int, gone func() bool, wait func(<-chan struct{}) bool) error {
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		if gone() {
			return nil
		}
		return fmt.Errorf("sending SIGINT: %w", err)
	}
	if wait(ctx.Done()) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	quitCtx, cancelQuit := context.WithTimeout(context.Background(), quitGrace)
	defer cancelQuit()
	if wait(quitCtx.Done()) {
		return fmt.Errorf("fast shutdown did not finish before %w; stopped with SIGQUIT (immediate shutdown)", context.Cause(ctx))
	}
	// The group (the postmaster's own, since it was started with Setpgid) includes backends
	// that would otherwise keep the shared memory attached and block the next start.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	killCtx, cancelKill := context.WithTimeout(context.Background(), quitGrace)
	defer cancelKill()
	if wait(killCtx.Done()) {
		return fmt.Errorf("fast shutdown did not finish before %w and SIGQUIT did not stop it; killed", context.Cause(ctx))
	}
	return fmt.Errorf("process %d survived SIGKILL", pid)
}

// waitPoll builds a wait for a process that is not our child, which we cannot wait(2) for.
func waitPoll(gone func() bool) func(<-chan struct{}) bool {
	return func(stop <-chan struct{}) bool {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		for !gone() {
			select {
			case <-stop:
				return gone()
			case <-t.C:
			}
		}
		return true
	}
}
