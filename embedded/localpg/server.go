package localpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ensureInitialised creates the cluster if DataDir holds none. initdb and the creation of the
// jetgres database run in a sibling directory that is renamed into place at the end, so a
// crash part-way leaves no half-made cluster that a later start would take for a real one.
func (c *Cluster) ensureInitialised(ctx context.Context, noSync bool) error {
	versionFile := filepath.Join(c.dataDir, "PG_VERSION")
	b, err := os.ReadFile(versionFile)
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(b)); got != strconv.Itoa(c.bins.major) {
			return fmt.Errorf("the cluster in %s was made by PostgreSQL %s but the binaries in %s are version %s: "+
				"point Config.BinDir at PostgreSQL %s binaries, or upgrade the cluster with pg_upgrade",
				c.dataDir, got, c.bins.dir, c.bins.version, got)
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("reading %s: %w", versionFile, err)
	}
	entries, err := os.ReadDir(c.dataDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reading data directory: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is not empty and holds no PostgreSQL cluster (no PG_VERSION): refusing to initialise over it", c.dataDir)
	}
	return c.initdb(ctx, noSync)
}

func (c *Cluster) initdb(ctx context.Context, noSync bool) error {
	start := time.Now()
	tmp := c.dataDir + ".initdb"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("removing leftover %s: %w", tmp, err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	defer os.RemoveAll(tmp)
	if err := c.user.chownTree(tmp); err != nil {
		return err
	}
	args := []string{"-D", tmp, "--username=" + Superuser, "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--data-checksums"}
	if noSync {
		args = append(args, "--no-sync")
	}
	c.log.Info("initialising PostgreSQL cluster", "data_dir", c.dataDir, "version", c.bins.version, "bin_dir", c.bins.dir)
	out, err := c.command(ctx, "initdb", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb failed: %w: %s", err, lastLines(out, 10))
	}
	c.log.Debug("initdb finished", "output", string(out))

	f, err := os.OpenFile(filepath.Join(tmp, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening postgresql.conf: %w", err)
	}
	_, err = f.WriteString(includeLine)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("adding the include of %s to postgresql.conf: %w", confFileName, err)
	}

	// Single-user mode needs no client and no socket; exit_on_error turns an ERROR into a
	// non-zero exit status instead of a line on stderr.
	single := c.command(ctx, "postgres", "--single", "-D", tmp, "-c", "exit_on_error=on", "-c", "fsync="+onOff(!noSync), "postgres")
	single.Stdin = strings.NewReader("CREATE DATABASE " + Database + "\n")
	if out, err := single.CombinedOutput(); err != nil {
		return fmt.Errorf("creating database %s: %w: %s", Database, err, lastLines(out, 10))
	}

	// Rename replaces DataDir if it is an empty directory, which a caller may have created.
	if err := os.Rename(tmp, c.dataDir); err != nil {
		return fmt.Errorf("moving the new cluster into place: %w", err)
	}
	if err := syncDir(filepath.Dir(c.dataDir)); err != nil {
		return err
	}
	c.log.Info("PostgreSQL cluster initialised", "data_dir", c.dataDir, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// start runs the postmaster and waits until its pid file says "ready", as pg_ctl -w does, or
// "standby", which a hot standby (standby.signal in its data directory) says once it
// accepts read-only connections.
func (c *Cluster) start(ctx context.Context) error {
	begin := time.Now()
	args := append([]string{"-D", c.dataDir}, commandLine(enforcedSettings(c.dataDir))...)
	cmd := c.command(context.Background(), "postgres", args...)
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("creating the server's log pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), logsDone: make(chan struct{})}
	c.mu.Lock()
	c.proc = p
	c.mu.Unlock()
	tail := &lineTail{}
	go func() {
		defer close(p.logsDone)
		defer r.Close()
		logServer(r, c.log, tail, &c.stopping)
	}()
	go func() {
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()

	pid := cmd.Process.Pid
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		if pf, err := readPidFile(c.dataDir); err == nil && pf.pid == pid && (pf.status == "ready" || pf.status == "standby") {
			break
		}
		select {
		case <-p.exited:
			<-p.logsDone
			log := tail.String()
			if strings.Contains(log, noSpace) {
				return fmt.Errorf("postgres exited while starting (%v): %w: %s", p.exitErr, errDiskFull, log)
			}
			return fmt.Errorf("postgres exited while starting (%v): %s", p.exitErr, log)
		case <-ctx.Done():
			_ = shutdown(ctx, pid, p.hasExited, p.waitExited)
			<-p.logsDone
			return fmt.Errorf("waiting for PostgreSQL to accept connections: %w (server log: %s)", context.Cause(ctx), tail.String())
		case <-t.C:
		}
	}
	c.log.Info("PostgreSQL ready", "version", c.bins.version, "pid", pid, "data_dir", c.dataDir,
		"user", c.user.name, "elapsed", time.Since(begin).Round(time.Millisecond))
	return nil
}

// command builds a child process for one of the server binaries: as the cluster's user, in its
// own process group (a terminal's Ctrl-C goes to jetgres, which stops the server in order), in
// a working directory that user can enter, with an environment that cannot redirect it.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.bins.path(name), args...)
	cmd.Dir = filepath.Dir(c.dataDir)
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.user.cred}
	return cmd
}

// childEnv drops PG* variables (PGDATA, PGPORT and the like would change what the binaries
// do) and locale variables, so initdb and the server speak plain English that logServer parses.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening %s to sync it: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(string(bytes.TrimSpace(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// lineTail keeps the server's last log lines so that a failed start can say why.
type lineTail struct {
	mu    sync.Mutex
	lines []string
}

const tailLines = 10

func (t *lineTail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == tailLines {
		t.lines = append(t.lines[:0], t.lines[1:]...)
	}
	t.lines = append(t.lines, line)
}

func (t *lineTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return "(no output)"
	}
	return strings.Join(t.lines, " | ")
}
