package e2e

// A full disk under PostgreSQL: its data directory on a small tmpfs of the test's own, filled
// with a file while publishers run, then freed. Publishes must be refused with a clear error
// meanwhile, /readyz must say not ready, and once the file is gone everything must come back
// without restarting jetgres, with every acknowledged publish stored exactly once.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

const (
	// diskSize is the tmpfs under the test's PostgreSQL data directory: an initialised
	// cluster with jetgres's schema takes about 70 MB of it, and the WAL grows towards
	// max_wal_size (1 GB) while the publishers run. With 160 MB, a fast machine filled the
	// disk again with WAL after the filler went, and the test saw a disk that never had room.
	diskSize = 512 << 20
	// walDiskSize is the tmpfs under pg_wal alone, which starts with one 16 MB segment.
	walDiskSize = 64 << 20
	// diskLeft is what the filler file leaves free: less than one WAL segment (16 MB), so
	// the next segment PostgreSQL needs cannot be created.
	diskLeft = 4 << 20
	// diskFullFor is how long the disk stays full once the first publish was refused.
	diskFullFor = 5 * time.Second
	diskStreams = 4
	// refuseBound guards against a hang: a refusal comes within the statement timeout (2 s)
	// of the transaction carrying the publish and of the one in flight before it, on a
	// machine the race detector slows.
	refuseBound = 10 * time.Second
)

// TestDiskFullExternal fills the disk of the PostgreSQL jetgres reaches through
// --database-url: the whole data directory, where a table that cannot grow refuses the
// insert (disk_full), and pg_wal alone, where PostgreSQL PANICs when it cannot create the next
// WAL segment and may stop (its crash recovery cannot write either). The test starts it again
// once the disk has room, as its operator would, and jetgres must follow without a restart of
// its own.
func TestDiskFullExternal(t *testing.T) {
	for _, wal := range []bool{false, true} {
		t.Run(map[bool]string{false: "data", true: "wal"}[wal], func(t *testing.T) {
			dir := newDataDir(t)
			full := dir
			if !wal {
				mountTmpfs(t, dir, diskSize)
			}
			db := &pgServer{t: t, dir: filepath.Join(dir, "pg")}
			if err := db.start(); err != nil {
				t.Fatalf("test PostgreSQL: %v", err)
			}
			if wal {
				if err := db.stop(); err != nil {
					t.Fatal(err)
				}
				full = moveWAL(t, db.dir, walDiskSize)
				if err := db.start(); err != nil {
					t.Fatalf("test PostgreSQL with pg_wal on a disk of its own: %v", err)
				}
			}
			t.Cleanup(func() {
				if err := db.stop(); err != nil && !db.hasExited() {
					t.Errorf("stopping the test PostgreSQL: %v", err)
				}
			})
			j := startWithDatabase(t, db.dsn(), "--stmt-timeout", "2s", "--replica-name", "e2e-diskfull")
			stopAtEnd(t, j)
			runDiskFull(t, j, full, db.dsn(), func(t *testing.T) bool {
				if !db.hasExited() {
					return false
				}
				_ = db.stop()
				if err := db.start(); err != nil {
					t.Fatalf("starting the test PostgreSQL again after its disk had room: %v", err)
				}
				return true
			})
		})
	}
}

// TestDiskFullPrivate fills jetgres's own data directory, where its private PostgreSQL
// lives, and then pg_wal alone. When PostgreSQL stops on the full disk, jetgres must start it
// again by itself once there is room, and must not give up and exit while the disk stays full:
// --pg-start-failures is low, so that counting the failed starts would end jetgres at once.
func TestDiskFullPrivate(t *testing.T) {
	for _, wal := range []bool{false, true} {
		t.Run(map[bool]string{false: "data", true: "wal"}[wal], func(t *testing.T) {
			dir := newDataDir(t)
			full := dir
			if !wal {
				mountTmpfs(t, dir, diskSize)
			}
			o := options{DataDir: dir, Args: []string{"--stmt-timeout", "2s", "--replica-name", "e2e-diskfull", "--pg-start-failures", "2"}}
			if wal {
				// The first start initialises the cluster, whose pg_wal then moves.
				j := startJetgres(t, o)
				j.stop(t)
				full = moveWAL(t, filepath.Join(dir, "pg"), walDiskSize)
			}
			j := startJetgres(t, o)
			failOnRace(t, j)
			stopAtEnd(t, j)
			dsn := fmt.Sprintf("host=%s port=5432 user=jetgres dbname=jetgres sslmode=disable", filepath.Join(dir, "pg"))
			runDiskFull(t, j, full, dsn, func(*testing.T) bool { return false })
			m, err := j.metrics()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("FIGURES disk-full private PostgreSQL restarts: %g", m["jetgres_private_postgres_restarts_total"])
		})
	}
}

// stopAtEnd stops j with SIGTERM when the test ends, before its disks are unmounted: a
// jetgres killed would leave its private PostgreSQL running on them.
func stopAtEnd(t *testing.T, j *jetgres) {
	t.Cleanup(func() {
		if !j.hasExited() {
			j.stop(t)
		}
	})
}

// moveWAL moves the pg_wal of the stopped cluster in dataDir onto a tmpfs of size bytes of
// its own, leaving a symbolic link in its place, and returns the tmpfs's mount point.
func moveWAL(t *testing.T, dataDir string, size int) string {
	t.Helper()
	walDir := filepath.Join(dataDir, "pg_wal")
	mnt := filepath.Join(filepath.Dir(dataDir), "wal")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mountTmpfs(t, mnt, size)
	var st syscall.Stat_t
	if err := syscall.Stat(walDir, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(mnt, int(st.Uid), int(st.Gid)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", walDir+"/.", mnt).CombinedOutput(); err != nil {
		t.Fatalf("copying pg_wal: %v: %s", err, out)
	}
	if err := os.RemoveAll(walDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(mnt, walDir); err != nil {
		t.Fatal(err)
	}
	return mnt
}

// runDiskFull publishes to j, fills the disk mounted at dir, checks the errors and /readyz,
// frees the disk, checks that publishing resumes and audits the database at dsn. restartDB
// starts PostgreSQL again if it stopped and says whether it had to.
func runDiskFull(t *testing.T, j *jetgres, dir, dsn string, restartDB func(*testing.T) bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, js := j.connect(t)
	var pubs []*publisher
	for i := range diskStreams {
		name := fmt.Sprintf("DISK%d", i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("disk%d.>", i)}, Duplicates: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
		p := newPublisher(fmt.Sprintf("f%d", i), name, fmt.Sprintf("disk%d.x", i), 1024, 64)
		p.ackTimeout = 5 * time.Second
		pubs = append(pubs, p)
	}
	smp := startSampler(j, 100*time.Millisecond)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	startPublishers(t, loadCtx, &wg, j.natsURL, pubs)
	probe := &diskProbe{}
	wg.Go(func() { probe.run(loadCtx, j.natsURL, "disk0.probe") })

	testwait.For(t, time.Minute, func() error {
		if s := summarize(pubs); s.acked < 2000 {
			return fmt.Errorf("%d publishes acknowledged before the disk fills", s.acked)
		}
		return nil
	})
	fillAt := time.Now()
	filler := fillDisk(t, dir, diskLeft)
	var firstErr, unready time.Time
	testwait.For(t, 2*time.Minute, func() error {
		if firstErr.IsZero() && errorsBetween(pubs, fillAt, time.Now()) > 0 {
			firstErr = time.Now()
		}
		if unready.IsZero() {
			if code, _, err := j.get("/readyz"); err == nil && code == 503 {
				unready = time.Now()
			}
		}
		if firstErr.IsZero() || unready.IsZero() {
			return fmt.Errorf("disk full for %v: no publish refused yet (%v) or /readyz not 503 yet (%v)", time.Since(fillAt), firstErr, unready)
		}
		return nil
	})
	_, readyBody, _ := j.get("/readyz")
	time.Sleep(time.Until(firstErr.Add(diskFullFor)))
	if j.hasExited() {
		t.Fatalf("jetgres exited on a full disk: %v", j.waitErr)
	}
	ackedFull := summarize(pubs).acked
	freeAt := time.Now()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	restarted := restartDB(t)
	var ready, firstAck time.Time
	testwait.For(t, 2*time.Minute, func() error {
		if ready.IsZero() {
			if code, _, err := j.get("/readyz"); err == nil && code == 200 {
				ready = time.Now()
			}
		}
		if firstAck.IsZero() {
			firstAck = firstAckAfter(pubs, freeAt)
		}
		if ready.IsZero() || firstAck.IsZero() {
			_, body, _ := j.get("/readyz")
			return fmt.Errorf("not back %v after the disk had room: ready %v (%s), PubAck %v", time.Since(freeAt), ready, body, firstAck)
		}
		return nil
	})
	// Some more new publishes after the recovery, then every id sent must have its PubAck.
	testwait.For(t, time.Minute, func() error {
		if s := summarize(pubs); s.acked < ackedFull+1000 {
			return fmt.Errorf("%d publishes acknowledged since the disk had room", s.acked-ackedFull)
		}
		return nil
	})
	waitAllAcked(t, pubs, 2*time.Minute)
	if j.hasExited() {
		t.Fatalf("jetgres exited: %v", j.waitErr)
	}
	stopLoad()
	wg.Wait()
	samples := smp.stop()

	sum := summarize(pubs)
	if len(sum.conflicts) > 0 {
		t.Errorf("ids acknowledged with two sequences: %v", sum.conflicts[:min(5, len(sum.conflicts))])
	}
	stored := 0
	audit := openProbe(t, dsn, 2)
	for _, p := range pubs {
		stored += auditSQL(t, audit, p.stream, ackedFor(pubs, p.stream))
	}
	probe.mu.Lock()
	defer probe.mu.Unlock()
	// A publish is refused with a store failure that says why; one whose commit got no
	// answer (its backend PANICked) is left for its client's timeout and Nats-Msg-Id retry.
	if sum.errs[10077] == 0 {
		t.Errorf("no publish was refused with err_code 10077 while the disk was full: %v", sum.errs)
	}
	if d := sum.maxErrIn[10077]; d > refuseBound {
		t.Errorf("a publish waited %v for its refusal, more than %v", d, refuseBound)
	}
	for _, e := range probe.errs {
		if e.api && (e.code != 503 || !strings.Contains(e.text, "disk full") && !strings.Contains(e.text, "unavailable")) {
			t.Errorf("the probe publisher got an unclear error on a full disk: %q", e.text)
		}
	}
	ready200 := 0
	for _, s := range between(samples, unready, freeAt) {
		if s.ready == 200 {
			ready200++
		}
	}
	if ready200 > 0 {
		t.Errorf("/readyz answered 200 %d times while the disk was full", ready200)
	}
	errCodes := make([]string, 0, len(sum.errs))
	for code, n := range sum.errs {
		errCodes = append(errCodes, fmt.Sprintf("%d:%d (longest wait %v)", code, n, sum.maxErrIn[code].Round(time.Millisecond)))
	}
	t.Logf("probe errors: %s", probe.describe())
	t.Logf("FIGURES disk-full: acked=%d stored=%d retries_answered_duplicate=%d errors=[%s] first_error_after_fill=%v readyz_503_after_fill=%v readyz_body=%q "+
		"full_for=%v db_restarted_by_test=%v readyz_200_after_free=%v first_puback_after_free=%v probe_longest_error_wait=%v",
		sum.acked, stored, sum.dupAcks, strings.Join(errCodes, " "), firstErr.Sub(fillAt).Round(time.Millisecond), unready.Sub(fillAt).Round(time.Millisecond),
		strings.TrimSpace(readyBody), freeAt.Sub(firstErr).Round(time.Millisecond), restarted,
		ready.Sub(freeAt).Round(time.Millisecond), firstAck.Sub(freeAt).Round(time.Millisecond), probe.longestErrWait().Round(time.Millisecond))
}

// mountTmpfs mounts a tmpfs of size bytes on dir for the rest of the test, or skips the test
// where this machine does not allow it.
func mountTmpfs(t *testing.T, dir string, size int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem to fill needs root; see README, \"A full disk\", for the manual procedure")
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0711", size)); err != nil {
		t.Skipf("cannot mount a tmpfs on %s (%v); see README, \"A full disk\", for the manual procedure", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting the tmpfs on %s: %v", dir, err)
			_ = syscall.Unmount(dir, syscall.MNT_DETACH)
		}
	})
}

// fillDisk writes a file into dir until only left bytes of its filesystem are free, and
// returns the file's path.
func fillDisk(t *testing.T, dir string, left int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	n := int64(st.Bavail)*st.Bsize - left
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		w, err := f.Write(buf[:min(int64(len(buf)), n)])
		n -= int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			// PostgreSQL took the space first.
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// auditSQL reads the stream straight from PostgreSQL and checks that every acknowledged id
// is stored exactly once, at the sequence its PubAck named, and that the sequences are
// dense. It returns the number of messages stored.
func auditSQL(t *testing.T, db interface {
	Strings(t testing.TB, sql string, args ...any) []string
}, stream string, acked map[string]uint64) int {
	t.Helper()
	// A body is its id padded with NUL bytes, which the escape encoding spells \000.
	rows := db.Strings(t, `SELECT seq::text || ' ' || split_part(encode(data, 'escape'), '\000', 1) FROM jetgres.messages($1, 1) ORDER BY seq`, stream)
	seqsOf := make(map[string][]uint64)
	var prev uint64
	for _, r := range rows {
		var seq uint64
		var id string
		if _, err := fmt.Sscanf(r, "%d %s", &seq, &id); err != nil {
			t.Fatalf("audit %s: row %q: %v", stream, r, err)
		}
		if prev != 0 && seq != prev+1 {
			t.Errorf("audit %s: sequence %d follows %d", stream, seq, prev)
		}
		prev = seq
		seqsOf[id] = append(seqsOf[id], seq)
	}
	for id, seqs := range seqsOf {
		if len(seqs) > 1 {
			t.Errorf("audit %s: id %s stored %d times, at %v", stream, id, len(seqs), seqs)
		}
	}
	lost := 0
	for id, seq := range acked {
		seqs := seqsOf[id]
		switch {
		case len(seqs) == 0:
			lost++
			if lost <= 5 {
				t.Errorf("audit %s: acknowledged id %s (sequence %d) is not in the database", stream, id, seq)
			}
		case seqs[0] != seq:
			t.Errorf("audit %s: id %s acknowledged as sequence %d, stored at %v", stream, id, seq, seqs)
		}
	}
	if lost > 5 {
		t.Errorf("audit %s: %d acknowledged ids missing in all", stream, lost)
	}
	return len(rows)
}

// diskProbe publishes one message at a time, synchronously, and keeps the text of every
// error it is answered with: what a client reads when the disk is full.
type diskProbe struct {
	mu   sync.Mutex
	acks int
	errs []diskProbeErr
}

type diskProbeErr struct {
	text string
	api  bool // a JetStream error answered, as opposed to no answer in time
	code int
	wait time.Duration
}

func (p *diskProbe) run(ctx context.Context, url, subject string) {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Name("disk-probe"))
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	for i := 0; ctx.Err() == nil; i++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		id := fmt.Sprintf("probe-%d", i)
		_, err := js.Publish(pctx, subject, []byte(id), jetstream.WithMsgID(id))
		cancel()
		p.mu.Lock()
		if err == nil {
			p.acks++
		} else if ctx.Err() == nil {
			e := diskProbeErr{text: err.Error(), wait: time.Since(start)}
			if apiErr, ok := errors.AsType[*jetstream.APIError](err); ok {
				e.api, e.code = true, apiErr.Code
			}
			p.errs = append(p.errs, e)
		}
		p.mu.Unlock()
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// longestErrWait is the longest wait for an error; the caller holds p.mu.
func (p *diskProbe) longestErrWait() time.Duration {
	var d time.Duration
	for _, e := range p.errs {
		d = max(d, e.wait)
	}
	return d
}

// describe counts the distinct error texts; the caller holds p.mu.
func (p *diskProbe) describe() string {
	n := make(map[string]int)
	var order []string
	for _, e := range p.errs {
		if n[e.text] == 0 {
			order = append(order, e.text)
		}
		n[e.text]++
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d acked, %d errors:", p.acks, len(p.errs))
	for _, text := range order {
		fmt.Fprintf(&b, " [%d× %s]", n[text], text)
	}
	return b.String()
}

// hasExited reports whether the server stopped on its own.
func (p *pgServer) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return false
	}
	select {
	case <-p.c.Done():
		return true
	default:
		return false
	}
}
