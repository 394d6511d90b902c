package localpg

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
)

func startSupervised(t *testing.T, dir string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{DataDir: dir, Settings: testSettings, Logger: testLogger(t), Restart: true, MaxFailedStarts: 3})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

// A supervised server killed with SIGKILL (its children survive it for a moment, and its pid
// file and shared memory stay behind) comes back by itself, with what it had committed.
func TestSupervisedRestartAfterKill(t *testing.T) {
	t.Parallel()
	c := startSupervised(t, dataDir(t))
	query(t, c, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')`)
	for round := range 2 {
		old := c.current().pid()
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, time.Minute, func() error {
			if c.Restarts() != int64(round+1) || !c.Up() {
				return errors.New("not restarted yet")
			}
			return nil
		})
		if c.current().pid() == old {
			t.Fatal("the restarted server has the killed one's pid")
		}
		var v string
		query(t, c, `SELECT v FROM kept`, &v)
		if v != "still here" {
			t.Fatalf("after restart %d kept.v = %q", round+1, v)
		}
	}
	select {
	case <-c.Done():
		t.Fatalf("Done closed although the server came back: %v", c.Err())
	default:
	}
	stop(t, c)
	if c.Up() {
		t.Error("Up() after Stop")
	}
}

// A supervised server whose data directory is gone cannot come back: Done is closed with a
// reason that says so, at once and without trying to start.
func TestSupervisedGivesUpWithoutDataDir(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	c := startSupervised(t, dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	// The server may notice by itself that its directory is gone, and exit first.
	if err := syscall.Kill(c.current().pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed a minute after the server died without its data directory")
	}
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "data directory "+dir+" is gone") {
		t.Fatalf("Err() = %v, want the data directory named as gone", err)
	}
	if c.Restarts() != 0 || c.Up() {
		t.Errorf("Restarts() = %d, Up() = %v after giving up", c.Restarts(), c.Up())
	}
}

// A supervised server that fails every start (its control file is gone) is given up after
// Config.MaxFailedStarts starts in a row, and Err names that bound.
func TestSupervisedGivesUpAfterFailedStarts(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	c := startSupervised(t, dir)
	if err := os.Remove(dir + "/global/pg_control"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.current().pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed a minute after the server died unable to start")
	}
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "3 restarts in a row failed (the bound is 3)") {
		t.Fatalf("Err() = %v, want the bound of 3 failed starts named", err)
	}
}
