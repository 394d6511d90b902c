//go:build soak

package e2e

// The soak's report: a judgement of whether each sampled quantity stayed flat after the
// warm-up, the curves as PNG, and a markdown section for BENCHMARKS.md linking them.

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// soakPlotDir is where the curves go, relative to the output directory and to
// BENCHMARKS.md, which links them there.
const soakPlotDir = "docs/soak"

// soakTolerance is the change between the first and the last hour after the warm-up that
// still counts as flat: a tenth of the first hour's mean, or the series' own floor when
// that is larger (a count near zero moves by more than a tenth without meaning anything).
const soakTolerance = 0.10

// soakSeries is one quantity the judgement looks at.
type soakSeries struct {
	name  string
	unit  string
	scale float64 // divides the raw value for display
	floor float64 // raw change that is never a trend
	get   func(soakSample) float64
}

func soakReplicaSeries(name, unit string, scale, floor float64, get func(soakReplicaSample) float64) []soakSeries {
	r1 := soakSeries{"r1 " + name, unit, scale, floor, func(s soakSample) float64 { return get(s.reps[0]) }}
	all := soakSeries{"all replicas " + name, unit, scale, 3 * floor, func(s soakSample) float64 {
		var sum float64
		for _, r := range s.reps {
			sum += get(r) // NaN while a replica restarts leaves the sample out
		}
		return sum
	}}
	return []soakSeries{r1, all}
}

func soakJudged() []soakSeries {
	var out []soakSeries
	out = append(out, soakReplicaSeries("RSS", "MiB", 1<<20, 16<<20, func(r soakReplicaSample) float64 { return r.rss })...)
	out = append(out, soakReplicaSeries("Go heap in use", "MiB", 1<<20, 16<<20, func(r soakReplicaSample) float64 { return r.heap })...)
	out = append(out, soakReplicaSeries("goroutines", "", 1, 50, func(r soakReplicaSample) float64 { return r.goroutines })...)
	out = append(out, soakReplicaSeries("open files", "", 1, 10, func(r soakReplicaSample) float64 { return r.fds })...)
	out = append(out, soakReplicaSeries("PostgreSQL connections", "", 1, 2, func(r soakReplicaSample) float64 { return r.conns })...)
	return append(out,
		soakSeries{"PostgreSQL client backends", "", 1, 3, func(s soakSample) float64 { return s.backends }},
		soakSeries{"jetgres tables", "MiB", 1 << 20, 8 << 20, func(s soakSample) float64 { return s.tableBytes }},
		soakSeries{"jetgres indexes", "MiB", 1 << 20, 8 << 20, func(s soakSample) float64 { return s.indexBytes }},
		soakSeries{"dead tuples", "", 1, 20_000, func(s soakSample) float64 { return s.dead }},
		soakSeries{"live tuples", "", 1, 20_000, func(s soakSample) float64 { return s.live }},
	)
}

// soakWindow is the mean and least-squares slope of one series over a span of samples.
type soakWindow struct {
	n           int
	mean, slope float64 // slope per hour
}

func soakFit(ss []soakSample, from, to time.Time, get func(soakSample) float64) soakWindow {
	var xs, ys []float64
	for _, s := range ss {
		if s.at.Before(from) || s.at.After(to) {
			continue
		}
		if v := get(s); !math.IsNaN(v) {
			xs = append(xs, s.at.Sub(from).Hours())
			ys = append(ys, v)
		}
	}
	w := soakWindow{n: len(xs), mean: math.NaN(), slope: math.NaN()}
	if w.n == 0 {
		return w
	}
	var mx, my float64
	for i := range xs {
		mx, my = mx+xs[i], my+ys[i]
	}
	mx, my = mx/float64(w.n), my/float64(w.n)
	w.mean = my
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx > 0 {
		w.slope = sxy / sxx
	}
	return w
}

// soakVerdict compares the last window with the first.
func soakVerdict(s soakSeries, first, last soakWindow) string {
	if first.n == 0 || last.n == 0 {
		return "no data"
	}
	change := last.mean - first.mean
	if math.Abs(change) <= max(soakTolerance*math.Abs(first.mean), s.floor) {
		return "flat"
	}
	if change > 0 {
		return "**grows**"
	}
	return "falls"
}

// report writes the plots and soak.md from the samples so far.
func (s *soakSampler) report(warmup time.Duration) error {
	return soakReport(s.out, s.all(), s.start, warmup)
}

// soakReport writes the plots and soak.md for samples taken since start into dir.
func soakReport(dir string, ss []soakSample, start time.Time, warmup time.Duration) error {
	if len(ss) == 0 {
		return nil
	}
	files, err := soakPlots(filepath.Join(dir, soakPlotDir), ss, start, warmup)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "soak.md"), []byte(soakMarkdown(ss, start, warmup, files)), 0o644)
}

func soakMarkdown(ss []soakSample, start time.Time, warmup time.Duration, files []soakPlot) string {
	var b strings.Builder
	end := ss[len(ss)-1].at
	last := ss[len(ss)-1]
	fmt.Fprintf(&b, "## A day of load\n\n")
	fmt.Fprintf(&b, "Three replicas on one PostgreSQL (fsync off, on one machine), one of them (r2 or r3 in turn) stopped with SIGTERM and started again every %v; r1 runs throughout. ", *soakFlagRestart)
	fmt.Fprintf(&b, "%d streams (a third with max_msgs %d, a third with max_age %v, a third purged in turn every %v: whole, keeping 100, or one subject), ", soakStreams, soakMaxMsgs, soakMaxAge, soakPurgeEvery)
	fmt.Fprintf(&b, "%d msg/s of %d bytes published asynchronously to random streams over %d connections, ", *soakFlagRate, soakPayload, soakConns)
	fmt.Fprintf(&b, "%d durable pull and %d durable push consumers acknowledging every message, ", soakPull, soakPush)
	fmt.Fprintf(&b, "%d key-value buckets of %d keys with %d puts and deletes a second from %d workers and %d watchers.\n\n", soakBuckets, soakKeys, *soakFlagKVRate, soakKVWorkers, soakWatchers)
	var flags []string
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "soak.") && f.Name != "soak.out" && f.Name != "soak.replay" {
			flags = append(flags, fmt.Sprintf("-%s %s", f.Name, f.Value))
		}
	})
	fmt.Fprintf(&b, "Samples every minute: each replica's resident memory, Go heap, goroutines (go_goroutines), open files (/proc/PID/fd) and PostgreSQL sessions (pg_stat_activity by application_name), and the jetgres schema's table and index sizes and dead tuples (pg_stat_user_tables). The bench command above does not run it, nor regenerate this section; this did:\n\n")
	fmt.Fprintf(&b, "```\ngo test -c -tags soak -o soak.test ./e2e/\n(cd e2e && ../soak.test -test.run TestDayOfLoad -test.v -test.timeout 0 %s)\n```\n\n", strings.Join(append(flags, "-soak.out DIR"), " "))
	b.WriteString("DIR then holds samples.csv and tables.csv (a row a minute, per table in the latter), this section as soak.md and the curves under docs/soak/.\n\n")
	fmt.Fprintf(&b, "Run from %s to %s UTC (%v), %d samples. Totals: %.0f published (%.0f errors), %.0f acknowledged (%.0f consume errors), %.0f key-value operations (%.0f errors), %.0f watch updates, %.0f purges (%.0f errors), %.0f restarts.\n\n",
		start.UTC().Format("2006-01-02 15:04"), end.UTC().Format("15:04"), end.Sub(start).Round(time.Minute), len(ss),
		last.published, last.pubErrors, last.acked, last.consumeErrors, last.kvOps, last.kvErrors, last.watched, last.purges, last.purgeErrors, last.restarts)

	from := start.Add(warmup)
	span := min(time.Hour, end.Sub(from)/2).Round(time.Second)
	if span <= 0 {
		fmt.Fprintf(&b, "The run ended before its warm-up of %v: no judgement.\n\n", warmup)
	} else {
		fmt.Fprintf(&b, "Judgement: after a warm-up of %v, the mean of the first %v (%v–%v) against that of the last %v (%v–%v); ",
			warmup, span, soakMin(warmup), soakMin(warmup+span), span, soakMin(end.Sub(start)-span), soakMin(end.Sub(start)))
		fmt.Fprintf(&b, "flat when they differ by at most %.0f %% (or the series' floor: 16 MiB, 50 goroutines, 10 files, 2 connections, 8 MiB of tables, 20,000 tuples). Slopes are least-squares fits within each window. \"All replicas\" adds the three up and leaves out the samples taken while one was restarting.\n\n", soakTolerance*100)
		fmt.Fprintf(&b, "| series | first mean | first slope /h | last mean | last slope /h | change | verdict |\n|---|---:|---:|---:|---:|---:|---|\n")
		for _, sr := range soakJudged() {
			first := soakFit(ss, from, from.Add(span), sr.get)
			lastW := soakFit(ss, end.Add(-span), end, sr.get)
			change := "–"
			if first.mean != 0 && first.n > 0 && lastW.n > 0 {
				change = fmt.Sprintf("%+.1f %%", 100*(lastW.mean-first.mean)/math.Abs(first.mean))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", sr.name,
				soakNum(first.mean, sr), soakNum(first.slope, sr), soakNum(lastW.mean, sr), soakNum(lastW.slope, sr), change, soakVerdict(sr, first, lastW))
		}
		b.WriteString("\n")
	}
	for _, f := range files {
		fmt.Fprintf(&b, "![%s](%s/%s)\n\n", f.Caption, soakPlotDir, f.Name)
	}
	return b.String()
}

func soakMin(d time.Duration) string { return fmt.Sprintf("%g min", math.Round(d.Minutes()*10)/10) }

func soakNum(v float64, s soakSeries) string {
	if math.IsNaN(v) {
		return "–"
	}
	v /= s.scale
	if s.unit == "" {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f %s", v, s.unit)
}

// soakPlot is one curve: its file name and its caption in soak.md.
type soakPlot struct {
	Name, Caption string
}

// soakLine is one curve of a plot.
type soakLine struct {
	label string
	get   func(soakSample) float64
}

func soakPerReplica(get func(soakReplicaSample) float64) []soakLine {
	var out []soakLine
	for i := range 3 {
		out = append(out, soakLine{fmt.Sprintf("r%d", i+1), func(s soakSample) float64 { return get(s.reps[i]) }})
	}
	return out
}

// soakPerSecond turns a running total into a rate per second between consecutive samples.
func soakPerSecond(ss []soakSample, total func(soakSample) float64) func(soakSample) float64 {
	prev := make(map[time.Time]soakSample)
	for i := 1; i < len(ss); i++ {
		prev[ss[i].at] = ss[i-1]
	}
	return func(s soakSample) float64 {
		p, ok := prev[s.at]
		if !ok {
			return math.NaN()
		}
		return (total(s) - total(p)) / s.at.Sub(p.at).Seconds()
	}
}

func soakPlots(dir string, ss []soakSample, start time.Time, warmup time.Duration) ([]soakPlot, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	const mb = 1 << 20
	plots := []struct {
		name, caption, title, y string
		scale                   float64
		lines                   []soakLine
	}{
		{"rss.png", "Resident memory of each replica", "Resident memory (r2 and r3 restart in turn)", "MiB", mb,
			soakPerReplica(func(r soakReplicaSample) float64 { return r.rss })},
		{"heap.png", "Go heap in use of each replica", "Go heap in use", "MiB", mb,
			soakPerReplica(func(r soakReplicaSample) float64 { return r.heap })},
		{"goroutines.png", "Goroutines of each replica", "Goroutines (go_goroutines)", "goroutines", 1,
			soakPerReplica(func(r soakReplicaSample) float64 { return r.goroutines })},
		{"open-files.png", "Open files of each replica", "Open files (/proc/PID/fd)", "files", 1,
			soakPerReplica(func(r soakReplicaSample) float64 { return r.fds })},
		{"pg-connections.png", "PostgreSQL sessions of each replica", "PostgreSQL sessions per replica (pg_stat_activity)", "sessions", 1,
			append(soakPerReplica(func(r soakReplicaSample) float64 { return r.conns }),
				soakLine{"all client backends", func(s soakSample) float64 { return s.backends }})},
		{"pg-size.png", "Size of the jetgres schema's tables and indexes", "jetgres schema size", "MiB", mb, []soakLine{
			{"tables (with TOAST)", func(s soakSample) float64 { return s.tableBytes }},
			{"indexes", func(s soakSample) float64 { return s.indexBytes }}}},
		{"pg-tuples.png", "Dead and live tuples of the jetgres schema", "Tuples (pg_stat_user_tables)", "tuples", 1, []soakLine{
			{"dead", func(s soakSample) float64 { return s.dead }},
			{"live", func(s soakSample) float64 { return s.live }}}},
		{"load.png", "The load, per second between samples", "Load", "per second", 1, []soakLine{
			{"published", soakPerSecond(ss, func(s soakSample) float64 { return s.published })},
			{"acknowledged", soakPerSecond(ss, func(s soakSample) float64 { return s.acked })},
			{"key-value operations", soakPerSecond(ss, func(s soakSample) float64 { return s.kvOps })},
			{"watch updates", soakPerSecond(ss, func(s soakSample) float64 { return s.watched })},
			{"publish errors", soakPerSecond(ss, func(s soakSample) float64 { return s.pubErrors })}}},
	}
	var files []soakPlot
	for _, pl := range plots {
		p := plot.New()
		p.Title.Text = pl.title
		p.X.Label.Text = fmt.Sprintf("minutes since start (warm-up: first %g)", warmup.Minutes())
		p.Y.Label.Text = pl.y
		p.Y.Min = 0
		for i, l := range pl.lines {
			// A sample the series lacks (a replica restarting) breaks its curve.
			var segs []plotter.XYs
			var cur plotter.XYs
			for _, s := range ss {
				v := l.get(s)
				if math.IsNaN(v) {
					if len(cur) > 0 {
						segs, cur = append(segs, cur), nil
					}
					continue
				}
				cur = append(cur, plotter.XY{X: s.at.Sub(start).Minutes(), Y: v / pl.scale})
			}
			if len(cur) > 0 {
				segs = append(segs, cur)
			}
			for k, seg := range segs {
				line, err := plotter.NewLine(seg)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", pl.name, err)
				}
				line.Color = plotutil.Color(i)
				line.Width = vg.Points(1.5)
				p.Add(line)
				if len(seg) == 1 {
					pts, err := plotter.NewScatter(seg)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", pl.name, err)
					}
					pts.Color = line.Color
					p.Add(pts)
				}
				if k == 0 {
					p.Legend.Add(l.label, line)
				}
			}
		}
		p.Legend.Top = true
		p.Legend.Left = true
		if err := p.Save(9*vg.Inch, 4*vg.Inch, filepath.Join(dir, pl.name)); err != nil {
			return nil, fmt.Errorf("%s: %w", pl.name, err)
		}
		files = append(files, soakPlot{pl.name, pl.caption})
	}
	return files, nil
}
