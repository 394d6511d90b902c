package bench

import (
	"context"
	"errors"
	"fmt"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

// The community's own benchmark, natscli's `nats bench`, run against every NATS target as a
// user would run it: the same binary, its own client code, its own streams and buckets.

// NatsCLIVersion is the natscli release the section is written for: its flags and its
// output are what natsBenchRuns and parseNatsBench expect.
const NatsCLIVersion = "v0.5.0"

// NatsBenchMsgsDefault is the message count of the section's throughput runs (publish
// async, fetch, consume, ordered); the runs of one operation at a time (publish sync, gets,
// key-value puts and gets) move a tenth of it, at least 100.
const NatsBenchMsgsDefault = 10_000

// natsBenchClients is the client count of the concurrent get runs that issue 16's goals
// name.
const natsBenchClients = 8

// Targets of the section: jetgres in each commit mode, beside the two JetStream targets.
const (
	TargetJetgresCommitOn  = "jetgres-commit-on"
	TargetJetgresCommitOff = "jetgres-commit-off"
)

// TargetNatsBenchFloor is the floor of `js pub async`: the same command against a responder
// behind jetgres's leafnode link that answers every publish with a PubAck at once and stores
// nothing. It is what jetgres's architecture (client → nats-server → link → bridge → back)
// costs before PostgreSQL, measured on the jetgres node of commit on.
const TargetNatsBenchFloor = "jetgres-link-floor"

// The floor's stream exists only so that nats bench finds it; its subject is not the one the
// floor's publishes go to, which the responder takes instead of the bridge.
const (
	natsBenchFloorStream  = "benchfloor"
	natsBenchFloorStored  = "benchfloor.stored"
	natsBenchFloorSubject = "benchfloor.acked"
)

// natsBenchTargets are the section's columns.
var natsBenchTargets = []string{TargetJetgresCommitOn, TargetJetgresCommitOff, TargetJetStream, TargetJetStreamSync}

var natsBenchLabels = map[string]string{
	TargetJetgresCommitOn:  "jetgres, commit on",
	TargetJetgresCommitOff: "jetgres, commit off",
	TargetJetStream:        "JetStream",
	TargetJetStreamSync:    "JetStream sync_always",
}

// The stream and bucket nats bench uses by default; each target's are deleted after its runs,
// so that the two jetgres nodes, which share a database, never meet each other's.
const (
	natsBenchStream = "benchstream"
	natsBenchBucket = "benchbucket"
	natsBenchSubj   = "benchsubject"
	// natsBenchConsumer is the durable consumer nats bench makes when it is given none.
	natsBenchConsumer = "nats-bench"
)

// natsBenchRun is one `nats bench` command of the section.
type natsBenchRun struct {
	name    string // the subcommand, as the report and the goals name it; clients tells the runs apart
	args    []string
	clients int
	// perOp marks the runs whose latencies are per operation; the others' are per batch
	// (async publish, fetch) or not measured (consume, ordered).
	perOp bool
	sync  bool // moves the smaller count
	// fresh deletes nats bench's durable consumer before the run: nats bench keeps it, with
	// its ack floor, so a second consumer run on it would wait for messages already taken.
	fresh bool
}

// label names the run in progress lines, failures and the report's table: its subcommand,
// and its client count when there are several.
func (run natsBenchRun) label() string {
	if run.clients > 1 {
		return fmt.Sprintf("%s, %d clients", run.name, run.clients)
	}
	return run.name
}

// natsBenchRuns lists the runs in the order they run on each target: the publishes fill the
// stream the consumers and gets then read, and the key-value puts fill the bucket the gets read.
func natsBenchRuns() []natsBenchRun {
	many := strconv.Itoa(natsBenchClients)
	return []natsBenchRun{
		{name: "js pub sync", args: []string{"js", "pub", "sync", natsBenchSubj, "--create"}, perOp: true, sync: true},
		{name: "js pub async", args: []string{"js", "pub", "async", natsBenchSubj}},
		{name: "js fetch", args: []string{"js", "fetch"}, fresh: true},
		{name: "js consume", args: []string{"js", "consume"}, fresh: true},
		{name: "js ordered", args: []string{"js", "ordered"}},
		{name: "js get sync", args: []string{"js", "get", "sync"}, perOp: true, sync: true},
		{name: "js get sync", args: []string{"js", "get", "sync", "--clients", many}, clients: natsBenchClients, perOp: true, sync: true},
		{name: "kv put", args: []string{"kv", "put"}, perOp: true, sync: true},
		{name: "kv get", args: []string{"kv", "get"}, perOp: true, sync: true},
		{name: "kv get", args: []string{"kv", "get", "--clients", many}, clients: natsBenchClients, perOp: true, sync: true},
	}
}

// natsBenchTimeout bounds one nats bench command of msgs messages: a consumer that waits for
// messages that never come fails the run instead of stalling it.
func natsBenchTimeout(msgs int) time.Duration {
	return 30*time.Second + time.Duration(msgs)*time.Millisecond
}

// findNatsCLI finds the nats binary on PATH, then in GOPATH/bin, where `go install` puts it.
func findNatsCLI() (string, error) {
	if p, err := exec.LookPath("nats"); err == nil {
		return p, nil
	}
	p := filepath.Join(build.Default.GOPATH, "bin", "nats")
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p, nil
	}
	return "", errors.New("natscli's nats is neither on PATH nor in GOPATH/bin")
}

// runNatsBench runs every nats bench command against jetgres in both commit modes and the two
// JetStream targets, one target after another.
func (r *runner) runNatsBench(ctx context.Context) {
	nb := &NatsBench{Msgs: r.cfg.NatsBenchMsgs, SyncMsgs: max(r.cfg.NatsBenchMsgs/10, 100), Size: r.cfg.Size}
	r.rep.NatsBench = nb
	bin, err := findNatsCLI()
	if err != nil {
		nb.Skipped = err.Error() + "; install it with go install github.com/nats-io/natscli/nats@" + NatsCLIVersion
		return
	}
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		nb.Skipped = fmt.Sprintf("%s --version: %v", bin, err)
		return
	}
	nb.CLIVersion = strings.TrimSpace(string(out))
	if nb.CLIVersion != NatsCLIVersion {
		r.log.Warn("nats bench: another natscli than the section expects", "found", nb.CLIVersion, "want", NatsCLIVersion)
	}

	for _, name := range natsBenchTargets {
		t, stop, err := r.natsBenchTarget(ctx, name)
		if err != nil {
			r.fail(SectionNatsBench, &benchTarget{name: name}, err)
			continue
		}
		if t == nil {
			continue
		}
		r.natsBenchOn(ctx, bin, t, nb)
		if name == TargetJetgresCommitOn && t.node != nil && ctx.Err() == nil {
			if err := r.natsBenchGetFloor(ctx, bin, t, nb); err != nil {
				r.fail(SectionNatsBench+" get floor", t, err)
			}
			if err := r.natsBenchFloor(ctx, bin, t, nb); err != nil {
				r.fail(SectionNatsBench+" js pub async floor", t, err)
			}
			if err := r.natsBenchStoreFloor(ctx, bin, t, nb); err != nil {
				r.fail(SectionNatsBench+" js pub async storage floor", t, err)
			}
		}
		if err := deleteNatsBenchState(t.url, true); err != nil {
			r.fail(SectionNatsBench, t, err)
		}
		if err := stop(); err != nil {
			r.fail(SectionNatsBench, t, err)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// natsBenchTarget is the section's target called name. jetgres in the commit mode that the
// run's own node does not use is started for the section alone, on the same database, and
// stop stops it; a jetgres given by URL runs in one mode only, Config.SynchronousCommit, and t
// is nil for the other.
func (r *runner) natsBenchTarget(ctx context.Context, name string) (t *benchTarget, stop func() error, err error) {
	none := func() error { return nil }
	var main *benchTarget
	for _, tt := range r.targets {
		if tt.name == TargetJetgres {
			main = tt
		}
		if tt.name == name {
			return tt, none, nil
		}
	}
	mode := "on"
	if name == TargetJetgresCommitOff {
		mode = "off"
	}
	switch {
	case main == nil:
		return nil, none, nil
	case mode == r.cfg.SynchronousCommit:
		return &benchTarget{name: name, url: main.url, node: main.node}, none, nil
	case main.node == nil:
		return nil, none, nil
	}
	push, pop, ack, err := defaultLanes()
	if err != nil {
		return nil, none, err
	}
	r.prog.phase("starting jetgres with --synchronous-commit "+mode, 0, 0)
	n, err := startJetgres(ctx, r.dsn, mode, push, pop, ack, r.log)
	if err != nil {
		return nil, none, err
	}
	return &benchTarget{name: name, url: n.url(), node: n}, n.stop, nil
}

// natsBenchOn runs every command against one target; what they made stays, for the floors.
func (r *runner) natsBenchOn(ctx context.Context, bin string, t *benchTarget, nb *NatsBench) {
	for _, run := range natsBenchRuns() {
		msgs := nb.Msgs
		// An fsync per message makes sync_always the slowest writer by far: it moves the
		// smaller count throughout, which keeps the section short and its rates comparable.
		if run.sync || t.name == TargetJetStreamSync {
			msgs = nb.SyncMsgs
		}
		label := run.label()
		r.prog.phase(fmt.Sprintf("nats bench     %s on %s", label, t.name), 0, 0)
		if run.fresh {
			if err := deleteNatsBenchState(t.url, false); err != nil {
				r.fail(SectionNatsBench+" "+label, t, err)
				continue
			}
		}
		res, err := runNatsBenchCLI(ctx, bin, nb.natsBenchArgs(t.url, nil, run.args, msgs), msgs)
		if err != nil {
			r.fail(SectionNatsBench+" "+label, t, err)
			continue
		}
		res.Bench, res.Clients, res.Target = run.name, max(run.clients, 1), t.name
		if !run.perOp {
			res.P50us, res.P90us, res.P99us = 0, 0, 0
		}
		nb.Results = append(nb.Results, res)
		if ctx.Err() != nil {
			return
		}
	}
}

// natsBenchFloor measures the link floor on t: its responder answers each publish on the
// link's read loop, as the bridge's intake runs, with a valid PubAck of the next sequence:
// nats.go checks the stream name, nothing else.
func (r *runner) natsBenchFloor(ctx context.Context, bin string, t *benchTarget, nb *NatsBench) error {
	link := t.node.link
	prefix := jswire.PubAckPrefix(natsBenchFloorStream)
	var seq atomic.Uint64
	return r.natsBenchPubOnLink(ctx, bin, t, nb, TargetNatsBenchFloor, "link floor", func(m *leaf.Msg) {
		if m.Reply != "" {
			_ = link.Publish(m.Reply, "", nil, jswire.PubAck(prefix, seq.Add(1), false))
		}
	})
}

// natsBenchArgs is the command line of one nats bench run against url: the global flags,
// then bench and its subcommand, moving msgs messages of the run's size.
func (nb *NatsBench) natsBenchArgs(url string, global, cmd []string, msgs int) []string {
	args := append(append([]string{"--server", url}, global...), "bench")
	args = append(args, cmd...)
	return append(args, "--msgs", strconv.Itoa(msgs), "--size", strconv.Itoa(nb.Size), "--no-progress")
}

// respondOnLink subscribes h to subject on t's leafnode link and waits until the server has
// the interest, so that the floor's first request finds its responder.
func respondOnLink(ctx context.Context, t *benchTarget, subject string, h leaf.Handler) (*leaf.Subscription, error) {
	sub, err := t.node.link.Subscribe(subject, "", h)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s on the link: %w", subject, err)
	}
	fctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := t.node.link.Flush(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("flush the link: %w", err)
	}
	return sub, nil
}

// runNatsBenchCLI runs one nats bench command of msgs messages and reads its summary.
func runNatsBenchCLI(ctx context.Context, bin string, args []string, msgs int) (NatsBenchResult, error) {
	rctx, cancel := context.WithTimeout(ctx, natsBenchTimeout(msgs))
	defer cancel()
	out, err := exec.CommandContext(rctx, bin, args...).CombinedOutput()
	if err != nil {
		return NatsBenchResult{}, fmt.Errorf("%w: %s", err, lastLine(out))
	}
	return parseNatsBench(string(out))
}

// deleteNatsBenchState deletes nats bench's durable consumer, and with all its stream and
// bucket too, those of them that exist.
func deleteNatsBenchState(url string, all bool) error {
	c, err := dial(url, "jetgres-bench nats bench clean-up")
	if err != nil {
		return err
	}
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := c.js.DeleteConsumer(ctx, natsBenchStream, natsBenchConsumer); err != nil &&
		!errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete consumer %s: %w", natsBenchConsumer, err)
	}
	if !all {
		return nil
	}
	var errs []error
	if err := c.js.DeleteStream(ctx, natsBenchStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		errs = append(errs, fmt.Errorf("delete stream %s: %w", natsBenchStream, err))
	}
	if err := c.js.DeleteKeyValue(ctx, natsBenchBucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		errs = append(errs, fmt.Errorf("delete bucket %s: %w", natsBenchBucket, err))
	}
	return errors.Join(errs...)
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

var (
	natsBenchStats = regexp.MustCompile(`(?m)^\s*NATS .*stats: ([\d,]+) msgs/sec`)
	natsBenchP50   = regexp.MustCompile(`P50:? ([\d,.]+)us`)
	natsBenchP90   = regexp.MustCompile(`P90:? ([\d,.]+)us`)
	natsBenchP99   = regexp.MustCompile(`P99:? ([\d,.]+)us`)
)

// parseNatsBench reads the summary nats bench prints last: "NATS … stats: N msgs/sec ~ …",
// with the latency percentiles on the same line for one client, or on the "latencies per
// operation" line after it for several (the lines before it are the clients' own).
func parseNatsBench(out string) (NatsBenchResult, error) {
	loc := natsBenchStats.FindStringSubmatchIndex(out)
	if loc == nil {
		return NatsBenchResult{}, fmt.Errorf("no summary line in the output of nats bench: %q", lastLine([]byte(out)))
	}
	num := func(s string) float64 {
		v, _ := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
		return v
	}
	res := NatsBenchResult{MsgsPerSec: num(out[loc[2]:loc[3]])}
	rest := out[loc[0]:]
	for _, p := range []struct {
		re   *regexp.Regexp
		into *float64
	}{{natsBenchP50, &res.P50us}, {natsBenchP90, &res.P90us}, {natsBenchP99, &res.P99us}} {
		if m := p.re.FindStringSubmatch(rest); m != nil {
			*p.into = num(m[1])
		}
	}
	return res, nil
}

// result finds one result of the section.
func (nb *NatsBench) result(bench string, clients int, target string) (NatsBenchResult, bool) {
	if nb == nil {
		return NatsBenchResult{}, false
	}
	for _, r := range nb.Results {
		if r.Bench == bench && r.Clients == clients && r.Target == target {
			return r, true
		}
	}
	return NatsBenchResult{}, false
}

// natsBenchGoals checks the run against issue 16's goals that nats bench's numbers decide.
// Reads do not depend on the commit mode: they are judged on the default, commit on.
func natsBenchGoals(nb *NatsBench) []Goal {
	var gs []Goal
	jg, js := TargetJetgresCommitOn, TargetJetStream
	for _, b := range []string{"js get sync", "kv get"} {
		if a, ok := nb.result(b, 1, jg); ok && a.P50us > 0 {
			if z, ok := nb.result(b, 1, js); ok && z.P50us > 0 {
				gs = append(gs, atMost("nats bench "+b+" p50 vs JetStream", a.P50us/z.P50us, 1.5, "×"))
			}
		}
		if a, ok := nb.result(b, natsBenchClients, jg); ok && a.MsgsPerSec > 0 {
			if z, ok := nb.result(b, natsBenchClients, js); ok && z.MsgsPerSec > 0 {
				gs = append(gs, atLeast(fmt.Sprintf("nats bench %s, %d clients, throughput vs JetStream", b, natsBenchClients), a.MsgsPerSec/z.MsgsPerSec, 1.0))
			}
		}
	}
	if put, ok := nb.result("kv put", 1, jg); ok && put.P50us > 0 {
		if pub, ok := nb.result("js pub sync", 1, jg); ok && pub.P50us > 0 {
			gs = append(gs, atMost("nats bench kv put p50 vs jetgres's own js pub sync p50", put.P50us/pub.P50us, 1.1, "×"))
		}
	}
	if z, ok := nb.result("js pub async", 1, js); ok && z.MsgsPerSec > 0 {
		for _, c := range []struct {
			target string
			want   float64
		}{{TargetJetgresCommitOff, 1.0}, {TargetJetgresCommitOn, 0.8}} {
			if a, ok := nb.result("js pub async", 1, c.target); ok && a.MsgsPerSec > 0 {
				gs = append(gs, atLeast("nats bench js pub async, "+natsBenchLabels[c.target]+", vs JetStream (default sync)", a.MsgsPerSec/z.MsgsPerSec, c.want))
			}
		}
	}
	return gs
}

// natsBenchHeader is the heading of the section's table: a column per target, then the
// throughput of jetgres in each mode over JetStream's.
func natsBenchHeader() []string {
	h := []string{"nats bench"}
	for _, t := range natsBenchTargets {
		h = append(h, natsBenchLabels[t])
	}
	return append(h, "commit on ÷ JetStream", "commit off ÷ JetStream")
}

// rows has a row per command: each target's msg/s and, where nats bench measures one
// operation at a time, its p50.
func (nb *NatsBench) rows() [][]string {
	if nb == nil {
		return nil
	}
	var rows [][]string
	for _, run := range natsBenchRuns() {
		clients := max(run.clients, 1)
		cells := []string{run.label()}
		seen := false
		for _, t := range natsBenchTargets {
			res, ok := nb.result(run.name, clients, t)
			switch {
			case !ok:
				cells = append(cells, "—")
			case res.P50us > 0:
				cells = append(cells, fmt.Sprintf("%s, p50 %s", fmtRate(res.MsgsPerSec), fmtMs(res.P50us)))
			default:
				cells = append(cells, fmtRate(res.MsgsPerSec))
			}
			seen = seen || ok
		}
		if !seen {
			continue
		}
		js, _ := nb.result(run.name, clients, TargetJetStream)
		for _, t := range []string{TargetJetgresCommitOn, TargetJetgresCommitOff} {
			jg, ok := nb.result(run.name, clients, t)
			if !ok || js.MsgsPerSec == 0 {
				cells = append(cells, "—")
				continue
			}
			cells = append(cells, fmtRatio(jg.MsgsPerSec/js.MsgsPerSec))
		}
		rows = append(rows, cells)
		for _, f := range natsBenchFloors {
			if row := nb.floorRow(run, js, f); row != nil {
				rows = append(rows, row)
			}
		}
	}
	return rows
}

// floorRow is floor's result for run under jetgres's columns, set against JetStream's js
// like jetgres's own, or nil when run has none.
func (nb *NatsBench) floorRow(run natsBenchRun, js NatsBenchResult, floor string) []string {
	f, ok := nb.result(run.name, max(run.clients, 1), floor)
	if !ok {
		return nil
	}
	ratio := "—"
	if js.MsgsPerSec > 0 {
		ratio = fmtRatio(f.MsgsPerSec / js.MsgsPerSec)
	}
	cells := []string{run.label() + ", " + floorName(floor, run)}
	for range natsBenchTargets {
		cells = append(cells, "—")
	}
	cell := fmtRate(f.MsgsPerSec)
	if f.P50us > 0 {
		cell += ", p50 " + fmtMs(f.P50us)
	}
	cells[1], cells[2] = cell, cell
	return append(cells, ratio, ratio)
}
