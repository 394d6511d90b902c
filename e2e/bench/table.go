package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// row is one line of the summary table: a metric with a value per target.
type row struct {
	metric string
	// lowerBetter marks latencies; the ratio columns read the same either way
	// (jetgres ÷ JetStream), so the heading says which direction is good.
	lowerBetter bool
	vals        map[string]float64
	format      func(float64) string
}

// summaryTargets are the columns of the summary table.
var summaryTargets = []string{TargetJetgres, TargetJetStream, TargetJetStreamSync, TargetPostgres}

func fmtRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// fmtMs shows microseconds as milliseconds with three significant digits.
func fmtMs(us float64) string {
	ms := us / 1000
	switch {
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	case ms >= 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms >= 1:
		return fmt.Sprintf("%.2f ms", ms)
	default:
		return fmt.Sprintf("%.3f ms", ms)
	}
}

func fmtRatio(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

func (rep *Report) summaryRows() []row {
	var rows []row
	add := func(metric string, lower bool, f func(float64) string, vals map[string]float64) {
		if len(vals) > 0 {
			rows = append(rows, row{metric: metric, lowerBetter: lower, vals: vals, format: f})
		}
	}
	pub := map[string]float64{}
	for _, p := range rep.Publish {
		pub[p.Target] = p.MsgsPerSec
	}
	add("async publish, msg/s", false, fmtRate, pub)
	p50, p99 := map[string]float64{}, map[string]float64{}
	for _, s := range rep.Sync {
		p50[s.Target], p99[s.Target] = s.Latency.P50us, s.Latency.P99us
	}
	add("sync publish p50", true, fmtMs, p50)
	add("sync publish p99", true, fmtMs, p99)
	fetch := map[string]float64{}
	for _, f := range rep.Fetch {
		fetch[f.Target] = f.MsgsPerSec
	}
	add("fetch + ack, msg/s", false, fmtRate, fetch)
	for _, mode := range slices.Concat(PushModes, OrderedReads, PushFloors) {
		push := map[string]float64{}
		for _, p := range rep.Push {
			if p.Mode == mode {
				push[p.Target] = p.MsgsPerSec
			}
		}
		add("push, "+mode+", msg/s", false, fmtRate, push)
	}
	for _, rate := range rep.Settings.Rates {
		lat := [6]map[string]float64{{}, {}, {}, {}, {}, {}}
		achieved := map[string]float64{}
		for _, l := range rep.Latency {
			if l.Rate != rate {
				continue
			}
			achieved[l.Target] = l.Achieved
			for i, s := range []LatencySummary{l.Producer, l.Subscriber, l.EndToEnd} {
				lat[2*i][l.Target], lat[2*i+1][l.Target] = s.P50us, s.P99us
			}
		}
		add(fmt.Sprintf("sent, msg/s, of %s/s offered", fmtRate(float64(rate))), false, fmtRate, achieved)
		for i, name := range []string{"producer", "subscriber", "end-to-end"} {
			add(fmt.Sprintf("%s p50 @ %s/s", name, fmtRate(float64(rate))), true, fmtMs, lat[2*i])
			add(fmt.Sprintf("%s p99 @ %s/s", name, fmtRate(float64(rate))), true, fmtMs, lat[2*i+1])
		}
	}
	return rows
}

func (rw row) cells() []string {
	cells := []string{rw.metric}
	for _, t := range summaryTargets {
		if v, ok := rw.vals[t]; ok {
			cells = append(cells, rw.format(v))
		} else {
			cells = append(cells, "—")
		}
	}
	jg, ok := rw.vals[TargetJetgres]
	for _, t := range []string{TargetJetStream, TargetJetStreamSync} {
		if v, vok := rw.vals[t]; ok && vok && v > 0 {
			cells = append(cells, fmtRatio(jg/v))
		} else {
			cells = append(cells, "—")
		}
	}
	return cells
}

func summaryHeader() []string {
	h := []string{"metric"}
	for _, t := range summaryTargets {
		h = append(h, targetLabels[t])
	}
	return append(h, "jetgres ÷ JetStream", "jetgres ÷ sync_always")
}

func (rep *Report) overloadRows() [][]string {
	var out [][]string
	for _, ov := range rep.Overload {
		for _, st := range ov.Steps {
			limit := "—"
			if st.AppendLimit > 0 {
				limit = fmt.Sprint(st.AppendLimit)
			}
			out = append(out, []string{targetLabels[ov.Target], fmt.Sprintf("%g×", st.Multiple), fmt.Sprint(st.Publishers),
				fmtRate(st.MsgsPerSec), fmt.Sprintf("%.0f %%", 100*st.MsgsPerSec/ov.Peak),
				fmtMs(st.Latency.P50us), fmtMs(st.Latency.P99us), fmt.Sprint(st.Errors), limit})
		}
	}
	return out
}

// insideRows set what a client saw beside what jetgres measured inside, for the phases
// where jetgres ran in-process.
func (rep *Report) insideRows() [][]string {
	var out [][]string
	for _, s := range rep.Sync {
		if s.Inside != nil {
			out = append(out, []string{"sync publish", fmtMs(s.Latency.MeanUs), fmtMs(s.Inside.PubAckUs),
				fmtMs(s.Inside.CommitUs), fmt.Sprintf("%.1f", s.Inside.BatchMsgs)})
		}
	}
	for _, p := range rep.Publish {
		if p.Inside != nil {
			out = append(out, []string{"async publish", "—", fmtMs(p.Inside.PubAckUs),
				fmtMs(p.Inside.CommitUs), fmt.Sprintf("%.1f", p.Inside.BatchMsgs)})
		}
	}
	return out
}

var insideHeader = []string{"jetgres phase", "client: publish → PubAck", "bridge: receipt → PubAck", "bridge: one transaction", "messages per transaction"}

var overloadHeader = []string{"target", "load", "publishers", "msg/s", "of peak", "p50", "p99", "errors", "push limit"}

// WriteText writes the tables for a terminal.
func (rep *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	line := func(cells []string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	line(summaryHeader())
	for _, rw := range rep.summaryRows() {
		line(rw.cells())
	}
	if rows := rep.insideRows(); len(rows) > 0 {
		fmt.Fprintln(tw)
		line(insideHeader)
		for _, cells := range rows {
			line(cells)
		}
	}
	if len(rep.Overload) > 0 {
		fmt.Fprintln(tw)
		line(overloadHeader)
		for _, cells := range rep.overloadRows() {
			line(cells)
		}
	}
	if rows := rep.sweepRows(); len(rows) > 0 {
		fmt.Fprintln(tw)
		line(sweepHeader)
		for _, cells := range rows {
			line(cells)
		}
	}
	if rows := rep.NatsBench.rows(); len(rows) > 0 {
		fmt.Fprintln(tw)
		line(natsBenchHeader())
		for _, cells := range rows {
			line(cells)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Goals) > 0 {
		fmt.Fprintln(w)
		for _, g := range rep.Goals {
			mark := "met   "
			if !g.Met {
				mark = "MISSED"
			}
			fmt.Fprintf(w, "%s  %s: %s (want %s)", mark, g.Name, g.Got, g.Want)
			if g.Gap != "" {
				fmt.Fprintf(w, ", %s", g.Gap)
			}
			fmt.Fprintln(w)
		}
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}
