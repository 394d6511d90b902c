package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestBackupRestoreBench measures one run of backup and restore through the nats CLI, jetgres
// against JetStream on the same machine in the same run: a stream of JETGRES_BACKUP_MSGS
// messages (1,000,000 unless set; headers on every fifth, every 97th deleted) is backed up
// from JetStream, restored into jetgres and into a second JetStream, and backed up from
// both. jetgres's resident memory is sampled every 100 ms throughout, to show that it stays
// bounded whatever the stream's size. It runs only with JETGRES_BACKUP_BENCH=1:
//
//	JETGRES_BACKUP_BENCH=1 go test -run TestBackupRestoreBench -v -timeout 60m ./e2e/
func TestBackupRestoreBench(t *testing.T) {
	if os.Getenv("JETGRES_BACKUP_BENCH") != "1" {
		t.Skip("set JETGRES_BACKUP_BENCH=1 to run")
	}
	n := 1_000_000
	if os.Getenv("JETGRES_BACKUP_MSGS") != "" {
		n = backupMsgs(t)
	}
	src, dst := startJetStream(t), startJetStream(t)
	j := startWithDatabase(t, testDatabase(t))
	mid := natsServer{name: "jetgres", url: j.natsURL}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()

	js := jsAt(t, src.url)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	fill(t, ctx, js, n)
	orders, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= uint64(n); seq += 97 {
		if err := orders.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	info, err := orders.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("filled %d messages (%d bytes, %d deleted) in %v", info.State.Msgs, info.State.Bytes, info.State.NumDeleted, time.Since(start).Round(time.Millisecond))

	dir := t.TempDir()
	timed := func(s natsServer, args ...string) time.Duration {
		start := time.Now()
		natsLong(t, s, args...)
		return time.Since(start)
	}
	peak := func(f func() time.Duration) (time.Duration, int64) {
		sm := startSampler(j, 100*time.Millisecond)
		d := f()
		var top int64
		for _, s := range sm.stop() {
			top = max(top, s.rss)
		}
		return d, top
	}
	rssBefore, err := vmRSS(j.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	fromSrc, fromMid, fromDst := filepath.Join(dir, "src"), filepath.Join(dir, "mid"), filepath.Join(dir, "dst")
	jsBackup := timed(src, "backup", "stream", "ORDERS", fromSrc, "--no-progress")
	jgRestore, rssRestore := peak(func() time.Duration { return timed(mid, "backup", "restore", "stream", fromSrc, "--no-progress") })
	jsRestore := timed(dst, "backup", "restore", "stream", fromSrc, "--no-progress")
	jgBackup, rssBackup := peak(func() time.Duration { return timed(mid, "backup", "stream", "ORDERS", fromMid, "--no-progress") })
	jsBackup2 := timed(dst, "backup", "stream", "ORDERS", fromDst, "--no-progress")
	sameStream(t, ctx, src, mid, "ORDERS")

	size := func(d string) int64 {
		st, err := os.Stat(filepath.Join(d, "stream.arc.s2"))
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	ratio := func(js, jg time.Duration) float64 { return js.Seconds() / jg.Seconds() }
	t.Logf("%d messages, archive %d bytes from JetStream, %d bytes from jetgres", info.State.Msgs, size(fromSrc), size(fromMid))
	t.Logf("| | JetStream | jetgres | jetgres vs JetStream |")
	t.Logf("|---|---|---|---|")
	t.Logf("| backup | %v (again: %v) | %v | %.2f× |", jsBackup.Round(time.Millisecond), jsBackup2.Round(time.Millisecond), jgBackup.Round(time.Millisecond), ratio(jsBackup, jgBackup))
	t.Logf("| restore | %v | %v | %.2f× |", jsRestore.Round(time.Millisecond), jgRestore.Round(time.Millisecond), ratio(jsRestore, jgRestore))
	t.Logf("jetgres RSS: %d MiB before, peak %d MiB during the restore, %d MiB during the backup", rssBefore>>20, rssRestore>>20, rssBackup>>20)
}
