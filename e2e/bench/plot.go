package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// PlotDir is where WriteFiles puts the plots, relative to the output directory.
const PlotDir = "docs/bench"

// targetColors keep one colour per target across every plot.
var targetColors = map[string]color.Color{
	TargetJetgres:       plotutil.Color(0),
	TargetJetgresFixed:  plotutil.Color(3),
	TargetJetStream:     plotutil.Color(1),
	TargetJetStreamSync: plotutil.Color(2),
	TargetPostgres:      plotutil.Color(4),
}

// plotFile is one plot: its file name and a caption for BENCHMARKS.md.
type plotFile struct {
	Name    string
	Caption string
}

// writePlots writes every plot the report has data for into dir, as PNG.
func (rep *Report) writePlots(dir string) ([]plotFile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	var files []plotFile
	save := func(p *plot.Plot, name, caption string) error {
		if err := p.Save(9*vg.Inch, 5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		files = append(files, plotFile{name, caption})
		return nil
	}
	if p := rep.throughputPlot(); p != nil {
		if err := save(p, "throughput.png", "Async publish and fetch + ack throughput"); err != nil {
			return nil, err
		}
	}
	if len(rep.Sync) > 0 {
		var series []distSeries
		for _, s := range rep.Sync {
			series = append(series, distSeries{label: targetLabels[s.Target], target: s.Target, h: s.hist})
		}
		p := distPlot("Lone sync publish: latency distribution", series)
		if err := save(p, "sync-publish-latency.png", "Latency distribution of a lone synchronous publisher"); err != nil {
			return nil, err
		}
	}
	for _, rate := range rep.Settings.Rates {
		var series []distSeries
		for _, l := range rep.Latency {
			if l.Rate != rate {
				continue
			}
			for i, kind := range []string{"producer", "subscriber", "end-to-end"} {
				series = append(series, distSeries{label: targetLabels[l.Target] + " " + kind, target: l.Target, h: l.hists[i], dash: i})
			}
		}
		if len(series) == 0 {
			continue
		}
		p := distPlot(fmt.Sprintf("Three latencies at %s msg/s offered", fmtRate(float64(rate))), series)
		name := fmt.Sprintf("latency-%d.png", rate)
		if err := save(p, name, fmt.Sprintf("Producer, subscriber and end-to-end latency at %s msg/s", fmtRate(float64(rate)))); err != nil {
			return nil, err
		}
	}
	if len(rep.Overload) > 0 {
		tp, p99 := rep.overloadPlots()
		if err := save(tp, "overload-throughput.png", "Throughput against offered load"); err != nil {
			return nil, err
		}
		if err := save(p99, "overload-p99.png", "p99 publish latency against offered load"); err != nil {
			return nil, err
		}
	}
	return files, nil
}

func (rep *Report) throughputPlot() *plot.Plot {
	if len(rep.Publish) == 0 && len(rep.Fetch) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "Throughput"
	p.Y.Label.Text = "messages per second"
	p.NominalX("async publish", "fetch + ack")
	width := vg.Points(22)
	i := 0
	for _, t := range summaryTargets {
		vals := plotter.Values{0, 0}
		have := false
		for _, r := range rep.Publish {
			if r.Target == t {
				vals[0], have = r.MsgsPerSec, true
			}
		}
		for _, r := range rep.Fetch {
			if r.Target == t {
				vals[1], have = r.MsgsPerSec, true
			}
		}
		if !have {
			continue
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			continue // only negative or NaN values fail, and rates are neither
		}
		bars.Color = targetColors[t]
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(i-len(summaryTargets)/2)
		p.Add(bars)
		p.Legend.Add(targetLabels[t], bars)
		i++
	}
	p.Legend.Top = true
	return p
}

// distSeries is one latency distribution to draw.
type distSeries struct {
	label  string
	target string
	h      *Histogram
	dash   int
}

// distPlot draws latency against percentile, HDR style: the x axis is stretched so that each
// added nine (90 %, 99 %, 99.9 %) gets the same width, which is where queues show.
func distPlot(title string, series []distSeries) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency (ms)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	maxNines := 0.0
	for _, s := range series {
		if s.h == nil || s.h.Count() == 0 {
			continue
		}
		// Beyond 1/count the distribution has no data, only its maximum.
		nines := min(math.Log10(float64(s.h.Count())), 4)
		maxNines = max(maxNines, nines)
		var pts plotter.XYs
		for x := 0.0; x <= nines+1e-9; x += 0.02 {
			q := 1 - math.Pow(10, -x)
			ms := float64(s.h.Quantile(q)) / 1e6
			pts = append(pts, plotter.XY{X: x, Y: max(ms, 0.001)})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			continue // NaN or infinite points cannot occur: quantiles are finite
		}
		l.Color = targetColors[s.target]
		l.Width = vg.Points(1.5)
		l.Dashes = plotutil.Dashes(s.dash)
		p.Add(l)
		p.Legend.Add(s.label, l)
	}
	var ticks []plot.Tick
	for i, label := range []string{"0 %", "90 %", "99 %", "99.9 %", "99.99 %"} {
		if float64(i) <= math.Ceil(maxNines) {
			ticks = append(ticks, plot.Tick{Value: float64(i), Label: label})
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

func (rep *Report) overloadPlots() (*plot.Plot, *plot.Plot) {
	tp, p99 := plot.New(), plot.New()
	tp.Title.Text = "Overload: throughput against offered load"
	tp.Y.Label.Text = "messages per second"
	p99.Title.Text = "Overload: p99 publish latency against offered load"
	p99.Y.Label.Text = "p99 (ms)"
	p99.Y.Scale = plot.LogScale{}
	p99.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	// A log axis: the sweep runs 1× to 10× and then, with 1,000 publishers, often far beyond.
	for _, p := range []*plot.Plot{tp, p99} {
		p.X.Label.Text = "offered load (× capacity)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Legend.Top = true
		p.Legend.Left = true
	}
	for _, ov := range rep.Overload {
		var a, b plotter.XYs
		for _, st := range ov.Steps {
			a = append(a, plotter.XY{X: st.Multiple, Y: st.MsgsPerSec})
			b = append(b, plotter.XY{X: st.Multiple, Y: max(st.Latency.P99us/1000, 0.001)})
		}
		for _, pair := range []struct {
			p   *plot.Plot
			pts plotter.XYs
		}{{tp, a}, {p99, b}} {
			l, s, err := plotter.NewLinePoints(pair.pts)
			if err != nil {
				continue // see distPlot
			}
			l.Color, s.Color = targetColors[ov.Target], targetColors[ov.Target]
			l.Width = vg.Points(1.5)
			pair.p.Add(l, s)
			pair.p.Legend.Add(targetLabels[ov.Target], l, s)
		}
	}
	return tp, p99
}
