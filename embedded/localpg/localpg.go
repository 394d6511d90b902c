package localpg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// ErrInUse is returned by Start when another live process runs a cluster on the data directory.
var ErrInUse = errors.New("data directory is in use by another process")

// Config configures Start.
type Config struct {
	// DataDir is the cluster's directory (jetgres passes <data-dir>/pg). It is created, and
	// initialised on first use, if needed; its parent must be writable, because the lock file
	// and the directory used while initialising live beside it. Required.
	DataDir string

	// Logger receives the server's log and the launcher's own records. Defaults to discarding.
	Logger *slog.Logger

	// BinDir is the directory holding postgres and initdb. Defaults to the directory of the
	// postgres found on PATH, then the highest /usr/lib/postgresql/<version>/bin.
	BinDir string

	// User is the OS user the server runs as when jetgres runs as root (PostgreSQL refuses to
	// run as root). When jetgres is not root the server runs as the current user, and User must
	// be empty or name that user. Defaults to "postgres" if that user exists, else "nobody".
	User string

	// Settings are extra postgresql.conf settings applied over localpg's defaults, e.g.
	// {"fsync": "off"} for a throwaway test cluster. Settings that keep the cluster private
	// (listen_addresses, unix_socket_directories, unix_socket_permissions, port) and the logging
	// settings localpg relies on are refused. Defaults to none.
	Settings map[string]string

	// Restart makes the Cluster supervise its server: when the server exits on its own (the
	// OOM killer, a kill -9), it is restarted at once, crash recovery included, and again with
	// exponential backoff while starts fail. Done is then closed only when the server cannot
	// come back: its data directory is gone, or MaxFailedStarts starts in a row failed (one
	// that failed on a full disk does not count); Err says which. Without Restart, Done is
	// closed when the server exits.
	Restart bool

	// MaxFailedStarts bounds the consecutive failed restarts before a supervised Cluster gives
	// up. Defaults to DefaultMaxFailedStarts.
	MaxFailedStarts int
}

// DefaultMaxFailedStarts is Config.MaxFailedStarts's default. With the backoff between starts
// (restartBackoffMin doubling up to restartBackoffMax) it gives a failing server about a
// minute to come back.
const DefaultMaxFailedStarts = 10

// Superuser and Database are the role and database jetgres uses in a local cluster.
const (
	Superuser = "jetgres"
	Database  = "jetgres"
)

// socketName is the socket's file name for port 5432; the OS limits the whole path (sun_path).
const (
	socketName    = ".s.PGSQL.5432"
	maxSocketPath = 107
)

// Cluster is a running private PostgreSQL server. Its methods are safe for concurrent use.
type Cluster struct {
	dataDir string
	bins    binaries
	user    osUser
	log     *slog.Logger
	lock    *os.File

	restart         bool
	maxFailedStarts int

	mu   sync.Mutex
	proc *proc // the server process running now, or the last one

	up       atomic.Bool
	restarts atomic.Int64
	diskFull atomic.Bool // the last start failed on a full disk

	done     chan struct{} // closed when the server has exited for good
	doneErr  error         // set before done is closed
	doneOnce sync.Once

	// superCtx ends when Stop begins; superDone is closed when the supervisor has returned.
	superCtx    context.Context
	superCancel context.CancelFunc
	superDone   chan struct{}

	stopping atomic.Bool // set when Stop begins, for logServer
	stopOnce sync.Once
	stopErr  error
}

// proc is one run of the postmaster.
type proc struct {
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the postmaster has exited
	exitErr  error         // set before exited is closed
	logsDone chan struct{} // closed when the server's stderr reached EOF
}

// Start returns a running cluster in cfg.DataDir, creating it on first use, or an error naming
// what failed. It returns when the server accepts connections; ctx bounds the whole start,
// including crash recovery and stopping an orphan left by a killed jetgres. If ctx ends first,
// the server is stopped and Start returns the context's error.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("localpg: Config.DataDir is required")
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("localpg: Config.DataDir: %w", err)
	}
	if len(dataDir)+1+len(socketName) > maxSocketPath {
		return nil, fmt.Errorf("localpg: Config.DataDir %s is too long: the server's socket %s inside it would exceed the %d-byte limit on Unix socket paths",
			dataDir, socketName, maxSocketPath)
	}
	if strings.Contains(dataDir, `"`) {
		return nil, fmt.Errorf("localpg: Config.DataDir %s contains a double quote, which unix_socket_directories cannot express", dataDir)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{dataDir: dataDir, log: log, restart: cfg.Restart, maxFailedStarts: cfg.MaxFailedStarts,
		done: make(chan struct{}), superDone: make(chan struct{})}
	if c.maxFailedStarts <= 0 {
		c.maxFailedStarts = DefaultMaxFailedStarts
	}
	if c.user, err = resolveUser(cfg.User); err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	settings, err := mergeSettings(cfg.Settings, enforcedSettings(dataDir))
	if err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	// What can be found wrong without the lock is found before anything is created, so that a
	// failed first start leaves no directory and no lock file behind.
	if c.bins, err = findBinaries(ctx, cfg.BinDir); err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	if err := c.user.checkTraversable(dataDir); err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	parentMode := fs.FileMode(0o700)
	if c.user.cred != nil {
		parentMode = 0o711
	}
	if err := os.MkdirAll(filepath.Dir(dataDir), parentMode); err != nil {
		return nil, fmt.Errorf("localpg: creating the parent of the data directory: %w", err)
	}
	// Again, now that every ancestor exists: a umask may have taken the mode MkdirAll asked for.
	if err := c.user.checkTraversable(dataDir); err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	if err := c.acquireLock(); err != nil {
		return nil, fmt.Errorf("localpg: %w", err)
	}
	if err := c.startLocked(ctx, settings); err != nil {
		c.releaseLock()
		return nil, fmt.Errorf("localpg: %w", err)
	}
	c.up.Store(true)
	c.superCtx, c.superCancel = context.WithCancel(context.Background())
	go c.supervise()
	return c, nil
}

// startLocked does the part of Start that needs the data directory's lock.
func (c *Cluster) startLocked(ctx context.Context, settings map[string]string) error {
	if err := c.ensureInitialised(ctx, isOff(settings["fsync"])); err != nil {
		return err
	}
	if err := c.user.chownTree(c.dataDir); err != nil {
		return err
	}
	if err := c.clearPidFile(ctx); err != nil {
		return err
	}
	if err := writeConf(c.dataDir, settings, c.user); err != nil {
		return err
	}
	return c.start(ctx)
}

// DSN is a keyword/value connection string for the jetgres database over the Unix socket.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("host=%s port=5432 user=%s dbname=%s sslmode=disable",
		quoteDSNValue(c.dataDir), Superuser, Database)
}

// BinDir is the directory of the PostgreSQL binaries the cluster runs, where their client
// tools (pg_basebackup, pg_ctl) are too.
func (c *Cluster) BinDir() string { return c.bins.dir }

// Pid is the postmaster's process id, which is also its process group's: a test that
// kills the group kills the server as a dead machine would.
func (c *Cluster) Pid() int { return c.current().pid() }

// SocketDir is the directory holding the server's Unix socket (the data directory).
func (c *Cluster) SocketDir() string { return c.dataDir }

// Done is closed when the server has exited for good: stopped, crashed without Config.Restart,
// or unable to come back with it.
func (c *Cluster) Done() <-chan struct{} { return c.done }

// Err is, once Done is closed, the server's exit status or why it cannot come back; nil
// before, and after a Stop.
func (c *Cluster) Err() error {
	select {
	case <-c.done:
		return c.doneErr
	default:
		return nil
	}
}

// Up reports whether the server runs and accepts connections; false while a supervised
// server is being restarted.
func (c *Cluster) Up() bool { return c.up.Load() }

// DiskFull reports whether a supervised server is down because its last start failed on a
// full disk; it is started again, with no bound on the attempts, until space is freed.
func (c *Cluster) DiskFull() bool { return c.diskFull.Load() }

// Restarts counts the successful restarts of a supervised server.
func (c *Cluster) Restarts() int64 { return c.restarts.Load() }

func (c *Cluster) current() *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

func (c *Cluster) finish(err error) {
	c.doneOnce.Do(func() {
		c.doneErr = err
		close(c.done)
	})
}

// Stop shuts the server down: a fast shutdown (open transactions roll back, clients are
// disconnected, a checkpoint is written) for as long as ctx allows, then an immediate shutdown
// (SIGQUIT; the next start runs crash recovery), then SIGKILL. It returns nil for a clean fast
// shutdown, and an error saying how the server was stopped otherwise, or that it had already
// exited on its own. Stop is safe to call more than once; later calls return the first result.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		c.stopping.Store(true)
		c.superCancel()
		<-c.superDone
		p := c.current()
		select {
		case <-c.done:
			if c.doneErr != nil {
				c.stopErr = fmt.Errorf("localpg: server had already exited: %w", c.doneErr)
			}
		default:
			if p.hasExited() {
				if p.exitErr != nil {
					c.stopErr = fmt.Errorf("localpg: server had already exited: %w", p.exitErr)
				}
				break
			}
			c.log.Info("stopping PostgreSQL (fast shutdown)", "pid", p.pid())
			if err := shutdown(ctx, p.pid(), p.hasExited, p.waitExited); err != nil {
				c.stopErr = fmt.Errorf("localpg: stopping server: %w", err)
			}
		}
		<-p.exited
		<-p.logsDone
		c.up.Store(false)
		c.finish(nil)
		c.releaseLock()
		if c.stopErr == nil {
			c.log.Info("PostgreSQL stopped")
		}
	})
	return c.stopErr
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *proc) waitExited(stop <-chan struct{}) bool {
	select {
	case <-p.exited:
		return true
	case <-stop:
		return p.hasExited()
	}
}

// acquireLock takes <DataDir>.lock. flock is released by the kernel when its holder dies,
// however it dies, which is what lets the next Start tell an orphaned server from a live one.
// The descriptor is close-on-exec, so the server never inherits the lock.
func (c *Cluster) acquireLock() error {
	path := c.dataDir + ".lock"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%s: %w (%s is locked)", c.dataDir, ErrInUse, path)
		}
		return fmt.Errorf("locking %s: %w", path, err)
	}
	c.lock = f
	return nil
}

func (c *Cluster) releaseLock() {
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
}

// quoteDSNValue quotes a keyword/value connection string value as libpq and pgx parse it.
func quoteDSNValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`) {
		return v
	}
	v = strings.ReplaceAll(v, `\`, `\\`)
	v = strings.ReplaceAll(v, `'`, `\'`)
	return "'" + v + "'"
}
