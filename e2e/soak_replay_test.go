//go:build soak

package e2e

// The soak's report rebuilt from its samples.csv, for a run killed before it could write its
// own or a judgement changed since, and the judgement tried on samples made up to be flat or
// to grow:
//
//	go test -tags soak -run TestSoakReplay ./e2e/ -args -soak.replay DIR -soak.duration 2h2m
//	go test -tags soak -run TestSoakJudgement ./e2e/
//
// The replay takes the run's flags again, for soak.md's description of the load.

import (
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var soakFlagReplay = flag.String("soak.replay", "", "rebuild soak.md and the curves in this directory from its samples.csv")

func TestSoakReplay(t *testing.T) {
	dir := *soakFlagReplay
	if dir == "" {
		t.Skip("no -soak.replay directory")
	}
	f, err := os.Open(filepath.Join(dir, "samples.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ss, start, err := soakParse(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := soakReport(dir, ss, start, *soakFlagWarmup); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d samples from %s: report rewritten in %s", len(ss), start.Format(time.RFC3339), dir)
}

// soakParse reads samples.csv back, and the time the run started (its first sample's time
// less its elapsed seconds).
func soakParse(r io.Reader) ([]soakSample, time.Time, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, time.Time{}, err
	}
	if len(rows) < 2 {
		return nil, time.Time{}, fmt.Errorf("%d rows, want a header and samples", len(rows))
	}
	col := make(map[string]int)
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, name := range soakHeader() {
		if _, ok := col[name]; !ok {
			return nil, time.Time{}, fmt.Errorf("no column %s", name)
		}
	}
	var ss []soakSample
	var start time.Time
	for n, row := range rows[1:] {
		at, err := time.Parse(time.RFC3339, row[col["time"]])
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("row %d: %w", n+2, err)
		}
		if n == 0 {
			elapsed, err := strconv.ParseFloat(row[col["elapsed_s"]], 64)
			if err != nil {
				return nil, time.Time{}, fmt.Errorf("row 2: %w", err)
			}
			start = at.Add(-time.Duration(elapsed * float64(time.Second)))
		}
		s := soakSample{at: at}
		for _, f := range soakFields {
			v := math.NaN()
			if cell := row[col[f.name]]; cell != "" {
				if v, err = strconv.ParseFloat(cell, 64); err != nil {
					return nil, time.Time{}, fmt.Errorf("row %d, %s: %w", n+2, f.name, err)
				}
			}
			*f.of(&s) = v
		}
		ss = append(ss, s)
	}
	return ss, start, nil
}

// TestSoakJudgement makes up 140 minutes of samples in which r1's memory grows by 80 MiB an
// hour while everything else wavers around a level, with r2 missing now and then as when it
// restarts: the report must call r1's memory growing and the rest flat, and read back from
// its CSV what it wrote.
func TestSoakJudgement(t *testing.T) {
	start := time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)
	var ss []soakSample
	for m := range 141 {
		h := float64(m) / 60
		wave := 1 + 0.05*math.Sin(float64(m)) // within the tolerance
		s := soakSample{at: start.Add(time.Duration(m) * time.Minute)}
		for i := range s.reps {
			s.reps[i] = soakReplicaSample{rss: 80 << 20 * wave, heap: 40 << 20 * wave, goroutines: 180 * wave, fds: 50 * wave, conns: 20 * wave}
		}
		s.reps[0].rss = 80 << 20 * (1 + h)
		if m%10 == 0 {
			s.reps[1] = soakReplicaSample{rss: math.NaN(), heap: math.NaN(), goroutines: math.NaN(), fds: math.NaN(), conns: math.NaN()}
		}
		s.backends, s.tableBytes, s.indexBytes, s.dead, s.live = 70*wave, 900<<20*wave, 60<<20*wave, 5000*wave, 400_000*wave
		s.published, s.acked = float64(m)*60_000, float64(m)*24_000
		ss = append(ss, s)
	}
	dir := t.TempDir()
	if err := soakReport(dir, ss, start, 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "soak.md"))
	if err != nil {
		t.Fatal(err)
	}
	verdicts := make(map[string]string)
	for line := range strings.Lines(string(md)) {
		cells := strings.Split(strings.TrimSpace(line), " | ")
		if len(cells) == 7 {
			verdicts[strings.TrimPrefix(cells[0], "| ")] = strings.TrimSuffix(cells[6], " |")
		}
	}
	for _, sr := range soakJudged() {
		want := "flat"
		if sr.name == "r1 RSS" || sr.name == "all replicas RSS" {
			want = "**grows**"
		}
		if got := verdicts[sr.name]; got != want {
			t.Errorf("%s judged %q, want %q:\n%s", sr.name, got, want, md)
		}
	}
	for _, png := range []string{"rss.png", "pg-size.png", "load.png"} {
		if _, err := os.Stat(filepath.Join(dir, soakPlotDir, png)); err != nil {
			t.Error(err)
		}
	}

	var b strings.Builder
	w := csv.NewWriter(&b)
	_ = w.Write(soakHeader())
	for _, s := range ss {
		_ = w.Write(s.row(start))
	}
	w.Flush()
	back, backStart, err := soakParse(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if !backStart.Equal(start) || len(back) != len(ss) {
		t.Fatalf("read back %d samples from %v, want %d from %v", len(back), backStart, len(ss), start)
	}
	for i := range ss {
		for _, f := range soakFields {
			want, got := *f.of(&ss[i]), *f.of(&back[i])
			if !(math.IsNaN(want) && math.IsNaN(got)) && math.Abs(want-got) > 1e-9*math.Abs(want) {
				t.Fatalf("sample %d, %s: read back %v, wrote %v", i, f.name, got, want)
			}
		}
	}
}
