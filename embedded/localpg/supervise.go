package localpg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// The backoff between failed restarts. The first restart after a crash is immediate: the
// server is our child, so its death is known the moment it happens.
const (
	restartBackoffMin = 250 * time.Millisecond
	restartBackoffMax = 10 * time.Second
)

// diskFullBackoffMax bounds the backoff between starts that failed on a full disk, which is
// also how long the server may stay down after space is freed.
const diskFullBackoffMax = 2 * time.Second

// errDiskFull is a start that failed because the server could not write: its crash recovery
// or its pid file found the disk full. The server comes back once space is freed.
var errDiskFull = errors.New("the disk is full")

// noSpace is how strerror words ENOSPC in the C locale the server runs in.
const noSpace = "No space left on device"

// groupGrace bounds the wait for the processes a killed postmaster leaves behind. Backends
// notice their postmaster's death by themselves and exit, but a new postmaster must not start
// while any of them still has the old shared memory attached.
const groupGrace = 10 * time.Second

// supervise waits on the server process and, with Config.Restart, starts a new one whenever
// it exits on its own. It returns when Stop begins, or when the server has exited for good.
func (c *Cluster) supervise() {
	defer close(c.superDone)
	for {
		p := c.current()
		select {
		case <-p.exited:
		case <-c.superCtx.Done():
			return
		}
		if c.superCtx.Err() != nil {
			return
		}
		c.up.Store(false)
		if !c.restart {
			c.finish(p.exitErr)
			return
		}
		<-p.logsDone
		c.log.Error("PostgreSQL exited on its own; restarting it", "pid", p.pid(), "status", p.exitErr)
		if err := c.restartServer(); err != nil {
			if c.superCtx.Err() != nil {
				return
			}
			c.finish(err)
			return
		}
		c.restarts.Add(1)
		c.up.Store(true)
	}
}

// restartServer starts a new server after the last one died, retrying with backoff. It fails
// when the server cannot come back: the data directory is gone, or c.maxFailedStarts starts
// in a row failed. A start that failed on a full disk does not count: PostgreSQL stops when
// it cannot write its WAL, and comes back once an operator frees space, however long that
// takes, so it is tried again every diskFullBackoffMax at most, for as long as it takes.
func (c *Cluster) restartServer() error {
	backoff := restartBackoffMin
	defer c.diskFull.Store(false)
	for failed := 0; ; {
		if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("its data directory %s is gone or holds no cluster (no PG_VERSION)", c.dataDir)
			}
			return fmt.Errorf("its data directory %s cannot be read: %w", c.dataDir, err)
		}
		err := c.startAgain()
		if err == nil {
			return nil
		}
		if c.superCtx.Err() != nil {
			return err
		}
		wait := backoff
		switch {
		case errors.Is(err, errDiskFull):
			wait = min(backoff, diskFullBackoffMax)
			if !c.diskFull.Swap(true) {
				c.log.Error("PostgreSQL cannot start: its disk is full; free space and it starts again by itself",
					"data_dir", c.dataDir, "retry_every", diskFullBackoffMax, "err", err)
			} else {
				c.log.Debug("PostgreSQL still cannot start: its disk is full", "in", wait)
			}
		default:
			failed++
			if failed >= c.maxFailedStarts {
				return fmt.Errorf("%d restarts in a row failed (the bound is %d); the last: %w", failed, c.maxFailedStarts, err)
			}
			c.log.Warn("restarting PostgreSQL failed; trying again", "failed", failed, "of", c.maxFailedStarts, "in", backoff, "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.superCtx.Done():
			t.Stop()
			return c.superCtx.Err()
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

// startAgain clears what the dead server left (its surviving children, its pid file) and
// starts a new one, which runs crash recovery.
func (c *Cluster) startAgain() error {
	pgid := c.current().pid()
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	graceCtx, cancel := context.WithTimeout(c.superCtx, groupGrace)
	defer cancel()
	gone := waitPoll(func() bool { return groupGone(pgid) })(graceCtx.Done())
	if err := c.superCtx.Err(); err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("processes of the dead server (process group %d) still run after %s", pgid, groupGrace)
	}
	if err := c.clearPidFile(c.superCtx); err != nil {
		return err
	}
	return c.start(c.superCtx)
}

// groupGone reports whether no live process is left in process group pgid. Zombies count as
// gone, as in processGone: the backends of a killed postmaster belong to whatever adopted
// them, which may be slow to reap them.
func groupGone(pgid int) bool {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		return true
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return false
	}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.State != "Z" && st.PGRP == pgid {
			return false
		}
	}
	return true
}
