package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg/pgtest"
)

// TestQuickRun runs the whole engine in quick mode against the real components (a private
// PostgreSQL, jetgres in-process, two JetStream servers) and checks that the report has every
// section with sane numbers and that the files it writes are what BENCHMARKS.md promises.
// The numbers themselves are not judged: a smoke run on a shared machine says nothing.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and three NATS servers; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Config{Quick: true, Command: "go run ./cmd/jetgres-bench --quick"})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, e := range rep.Errors {
		t.Errorf("measurement failed: %s", e)
	}

	all := []string{TargetJetgres, TargetJetStream, TargetJetStreamSync, TargetPostgres}
	natsTargets := all[:3]
	checkTargets(t, "publish", all, collect(rep.Publish, func(p PubResult) (string, float64) { return p.Target, p.MsgsPerSec }))
	checkTargets(t, "sync publish", all, collect(rep.Sync, func(s SyncResult) (string, float64) { return s.Target, s.MsgsPerSec }))
	checkTargets(t, "fetch", []string{TargetJetgres, TargetJetStream}, collect(rep.Fetch, func(f FetchResult) (string, float64) { return f.Target, f.MsgsPerSec }))
	for _, mode := range slices.Concat(PushFloors, PushModes, OrderedReads) {
		targets := []string{TargetJetgres, TargetJetStream}
		if slices.Contains(PushFloors, mode) {
			targets = targets[:1]
		}
		var inMode []PushResult
		for _, p := range rep.Push {
			if p.Mode == mode {
				inMode = append(inMode, p)
			}
			// Every run costs the process CPU. PostgreSQL's, which the private cluster lets
			// the bench read, comes from /proc in clock ticks of 10 ms: a quick run's read
			// floor may cost it less than one, so only a negative figure is wrong.
			if p.Mode == mode && (p.CPUUsPerMsg <= 0 || p.PGCPUUsPerMsg < 0) {
				t.Errorf("push %s on %s: CPU µs per message %g in the process, %g in PostgreSQL", mode, p.Target, p.CPUUsPerMsg, p.PGCPUUsPerMsg)
			}
		}
		checkTargets(t, "push "+mode, targets, collect(inMode, func(p PushResult) (string, float64) { return p.Target, p.MsgsPerSec }))
	}
	// Each of jetgres's modes has a ratio to the CPU floor that bounds it, ack explicit to
	// the one whose floor acks every message.
	for _, row := range rep.pushRows() {
		if row[1] == targetLabels[TargetJetgres] && slices.Contains(PushModes, row[0]) && row[len(row)-1] == "—" {
			t.Errorf("push %s on jetgres has no ratio to its CPU floor: %q", row[0], row)
		}
	}
	checkTargets(t, "latency", natsTargets, collect(rep.Latency, func(l LatResult) (string, float64) { return l.Target, l.Achieved }))
	checkTargets(t, "overload", append([]string{TargetJetgresFixed}, all...), collect(rep.Overload, func(o Overload) (string, float64) { return o.Target, o.Peak }))

	for _, s := range rep.Sync {
		checkLatency(t, "sync publish on "+s.Target, s.Latency)
	}
	for _, l := range rep.Latency {
		for name, s := range map[string]LatencySummary{"producer": l.Producer, "subscriber": l.Subscriber, "end-to-end": l.EndToEnd} {
			checkLatency(t, name+" latency on "+l.Target, s)
		}
	}
	for _, o := range rep.Overload {
		if len(o.Steps) < len(multiplesQuick) {
			t.Errorf("overload on %s: %d steps, want at least %d", o.Target, len(o.Steps), len(multiplesQuick))
		}
		for _, st := range o.Steps {
			if st.MsgsPerSec <= 0 {
				t.Errorf("overload on %s at %g×: no throughput", o.Target, st.Multiple)
			}
			checkLatency(t, "overload on "+o.Target, st.Latency)
		}
	}
	if len(rep.Sweep) != len(sweepStreamsQuick)*len(sweepPublishersQuick) {
		t.Errorf("sweep: %d levels, want %d", len(rep.Sweep), len(sweepStreamsQuick)*len(sweepPublishersQuick))
	}
	for _, lv := range rep.Sweep {
		for name, p := range map[string]SweepPoint{"jetgres cold": lv.Cold, "jetgres warm": lv.Warm, "naive bridge": lv.Bridge, "naive INSERT": lv.Insert} {
			if p.MsgsPerSec <= 0 || p.P50us <= 0 || p.P99us < p.P50us || p.Errors > 0 {
				t.Errorf("sweep at %d streams, %d publishers, %s: %+v", lv.Streams, lv.Publishers, name, p)
			}
		}
	}
	if !slices.ContainsFunc(rep.Goals, func(g Goal) bool { return strings.HasPrefix(g.Name, "sweep: jetgres warm vs naive bridge") }) {
		t.Errorf("no sweep goal among %+v", rep.Goals)
	}
	if len(rep.Goals) == 0 {
		t.Error("no goal was checked")
	}
	checkNatsBench(t, rep.NatsBench)
	// The private cluster preloads pg_stat_statements, and the naive baseline's INSERT is
	// among the statements it ran most.
	if !slices.ContainsFunc(rep.Statements, func(s StatementStats) bool {
		return strings.HasPrefix(s.Query, "INSERT INTO "+pgtest.NaiveSchema+"."+pgtest.NaiveTable) && s.Calls > 0
	}) {
		t.Errorf("the report does not list the naive INSERT among its statements: %+v", rep.Statements)
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("the JSON report does not parse: %v", err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatalf("WriteText: %v", err)
	}
	for _, want := range []string{"async publish", "fetch + ack", "push, ordered", "end-to-end p50", "push limit", "naive bridge"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, text.String())
		}
	}

	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatalf("WriteFiles: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Machine", "## Results", "## Goals", "## Overload", "## Many streams", "## nats bench", "## Plots", "go run ./cmd/jetgres-bench --quick", "vs CPU floor", "| ack floor |", "| ack CPU floor |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("BENCHMARKS.md has no %q", want)
		}
	}
	if strings.Contains(string(md), os.TempDir()) {
		t.Error("BENCHMARKS.md mentions a path of this machine")
	}
	pngs, _ := filepath.Glob(filepath.Join(dir, PlotDir, "*.png"))
	if len(pngs) < 5 {
		t.Errorf("%d plots written, want at least 5: %v", len(pngs), pngs)
	}
	for _, p := range pngs {
		name := filepath.Base(p)
		if !strings.Contains(string(md), PlotDir+"/"+name) {
			t.Errorf("BENCHMARKS.md does not show %s", name)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Errorf("%s is not a valid PNG: %v", name, err)
		} else if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
			t.Errorf("%s is only %dx%d", name, b.Dx(), b.Dy())
		}
	}
}

func collect[T any](rs []T, f func(T) (string, float64)) map[string]float64 {
	m := map[string]float64{}
	for _, r := range rs {
		k, v := f(r)
		m[k] = v
	}
	return m
}

func checkTargets(t *testing.T, section string, want []string, got map[string]float64) {
	t.Helper()
	for _, w := range want {
		v, ok := got[w]
		switch {
		case !ok:
			t.Errorf("%s: no result for %s", section, w)
		case !(v > 0):
			t.Errorf("%s on %s: %v, want a positive rate", section, w, v)
		}
	}
}

func checkLatency(t *testing.T, what string, s LatencySummary) {
	t.Helper()
	if s.Count == 0 {
		t.Errorf("%s: nothing recorded", what)
		return
	}
	if !(s.P50us > 0 && s.P50us <= s.P99us && s.P99us <= s.MaxUs) {
		t.Errorf("%s: p50 %.0f µs, p99 %.0f µs, max %.0f µs are not ordered", what, s.P50us, s.P99us, s.MaxUs)
	}
}

// checkNatsBench checks that nats bench ran every command against every target, or says why
// the section was skipped.
func checkNatsBench(t *testing.T, nb *NatsBench) {
	t.Helper()
	switch {
	case nb == nil:
		t.Error("the nats bench section did not run")
		return
	case nb.Skipped != "":
		t.Logf("nats bench skipped: %s", nb.Skipped)
		return
	case nb.CLIVersion == "":
		t.Error("nats bench: the natscli version is not named")
	}
	for _, target := range natsBenchTargets {
		for _, run := range natsBenchRuns() {
			res, ok := nb.result(run.name, max(run.clients, 1), target)
			switch {
			case !ok:
				t.Errorf("nats bench %s (%d clients) on %s: no result", run.name, max(run.clients, 1), target)
			case !(res.MsgsPerSec > 0):
				t.Errorf("nats bench %s on %s: %v msg/s", run.name, target, res.MsgsPerSec)
			case run.perOp && !(res.P50us > 0 && res.P50us <= res.P99us):
				t.Errorf("nats bench %s on %s: p50 %v µs, p99 %v µs", run.name, target, res.P50us, res.P99us)
			}
		}
	}
	for _, floor := range natsBenchFloors {
		if f, ok := nb.result("js pub async", 1, floor); !ok || !(f.MsgsPerSec > 0) {
			t.Errorf("nats bench js pub async, %s: %+v (measured %v)", floor, f, ok)
		}
	}
	for _, run := range natsBenchRuns() {
		if !run.getFloor() {
			continue
		}
		if f, ok := nb.result(run.name, max(run.clients, 1), TargetNatsBenchFloor); !ok || !(f.MsgsPerSec > 0 && f.P50us > 0) {
			t.Errorf("nats bench %s link floor: %+v (measured %v)", run.label(), f, ok)
		}
	}
}
