package localpg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
)

// A supervised server that cannot start because its disk is full is not given up, however
// many starts fail (more than Config.MaxFailedStarts here): DiskFull says why it is down, and
// it comes back by itself, with what it had committed, once space is freed.
func TestSupervisedWaitsForDiskSpace(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("filling a disk of the test's own needs root, to mount a tmpfs")
	}
	dir := dataDir(t)
	mnt := filepath.Dir(dir)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=96m,mode=0711"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	c := startSupervised(t, dir)
	query(t, c, `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')`)

	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); errors.Is(err, syscall.ENOSPC) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	// The next WAL record goes to a new segment, which the crash recovery's checkpoint
	// cannot create on the full disk.
	query(t, c, `SELECT pg_switch_wal()`)
	if err := syscall.Kill(c.current().pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, func() error {
		if !c.DiskFull() || c.Up() {
			return fmt.Errorf("DiskFull() = %v, Up() = %v on a full disk", c.DiskFull(), c.Up())
		}
		return nil
	})
	// Four failed starts or more: the backoff on a full disk is 250 ms, doubling up to 2 s.
	select {
	case <-c.Done():
		t.Fatalf("gave up on a full disk: %v", c.Err())
	case <-time.After(5 * time.Second):
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, func() error {
		if !c.Up() || c.DiskFull() || c.Restarts() != 1 {
			return fmt.Errorf("Up() = %v, DiskFull() = %v, Restarts() = %d after space was freed", c.Up(), c.DiskFull(), c.Restarts())
		}
		return nil
	})
	var v string
	query(t, c, `SELECT v FROM kept`, &v)
	if v != "still here" {
		t.Fatalf("after the restart kept.v = %q", v)
	}
}
