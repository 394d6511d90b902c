package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/internal/jstwin"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// runner holds one run: its configuration, the targets and the report being filled.
type runner struct {
	cfg  Config
	log  *slog.Logger
	prog *progress
	rep  *Report
	dsn  string
	// targets in table order: jetgres, JetStream, JetStream sync_always, naive INSERT.
	targets []*benchTarget
	// probe serves the bench's own queries: settings and statement statistics.
	probe *pgtest.ServerProbe
	// noCheckpoint: the probe may not CHECKPOINT, and settle has said so.
	noCheckpoint bool
	// statements is set when the server has pg_stat_statements.
	statements bool
}

// topStatements is how many of the statements with the most execution time the report lists.
const topStatements = 12

// readStatements reads the statements with the most execution time.
func (r *runner) readStatements(ctx context.Context) ([]StatementStats, error) {
	sts, err := r.probe.TopStatements(ctx, topStatements)
	if err != nil {
		return nil, err
	}
	out := make([]StatementStats, len(sts))
	for i, s := range sts {
		out[i] = StatementStats(s)
	}
	return out, nil
}

// Run starts the targets, runs the configured sections and returns the report. A
// measurement that fails is named in Report.Errors and the run goes on; Run itself fails only
// when a target cannot be started, or when ctx ends. Everything it started is stopped before
// it returns.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	r := &runner{cfg: cfg, log: cfg.Logger, prog: newProgress(cfg.Progress, cfg.ProgressTTY)}
	defer r.prog.close()
	r.rep = &Report{
		Command: cfg.Command,
		Started: time.Now().UTC().Truncate(time.Second),
		Settings: RunSettings{
			Msgs: cfg.Msgs, Size: cfg.Size, DurationSeconds: cfg.Duration.Seconds(), Window: cfg.Window,
			FetchBatch: FetchBatchDefault, KVKeys: cfg.KVKeys, ObjectBytes: cfg.ObjectBytes,
			Rates: r.rates(), OverloadStreams: r.overloadStreams(),
			Quick: cfg.Quick, Sections: cfg.Only,
		},
	}
	stop, err := r.start(ctx)
	defer func() {
		if stopErr := stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("bench: stopping: %w", stopErr))
		}
	}()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	sections := map[string]func(context.Context){
		SectionPub: r.runPub, SectionFetch: r.runFetch, SectionPush: r.runPush, SectionLatency: r.runLatency,
		SectionOverload: r.runOverload, SectionSweep: r.runSweep, SectionNatsBench: r.runNatsBench,
	}
	for _, s := range Sections {
		if !cfg.runs(s) {
			continue
		}
		sections[s](ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", s, err)
		}
	}
	r.rep.Seconds = time.Since(r.rep.Started).Round(time.Second).Seconds()
	if r.statements {
		sts, serr := r.readStatements(ctx)
		if serr != nil {
			r.rep.Errors = append(r.rep.Errors, serr.Error())
		}
		r.rep.Statements = sts
	}
	r.rep.Goals = append(append(goals(r.rep), sweepGoals(r.rep.Sweep)...), natsBenchGoals(r.rep.NatsBench)...)
	return r.rep, nil
}

// start brings up PostgreSQL, the naive baseline, jetgres and the two JetStream servers,
// and returns the function that stops whatever it started, in reverse order.
func (r *runner) start(ctx context.Context) (func() error, error) {
	var stops []func() error
	stop := func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}
	// The private cluster's data directory must be reachable by the unprivileged user the
	// server runs as when the bench runs as root.
	dir, err := os.MkdirTemp("", "jetgres-bench-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		return stop, fmt.Errorf("temporary directory: %w", err)
	}
	stops = append(stops, func() error { return os.RemoveAll(dir) })

	m := &r.rep.Machine
	m.Database, m.Jetgres = "private cluster", "in-process"
	r.dsn = r.cfg.DatabaseURL
	if r.dsn == "" {
		r.prog.phase("starting PostgreSQL", 0, 0)
		cluster, err := localpg.Start(ctx, localpg.Config{
			DataDir: filepath.Join(dir, "pg"),
			Logger:  r.log.With("component", "postgres"),
			// Durable commits are the point of the comparison; max_connections leaves room for
			// the fixed-concurrency node's pool beside the others; pg_stat_statements tells
			// where the server's time went.
			Settings: map[string]string{"fsync": "on", "synchronous_commit": "on", "max_connections": "600",
				"shared_preload_libraries": "pg_stat_statements"},
		})
		if err != nil {
			return stop, fmt.Errorf("private PostgreSQL: %w", err)
		}
		stops = append(stops, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			return cluster.Stop(ctx)
		})
		r.dsn = cluster.DSN()
	} else {
		m.Database = "given by URL"
	}

	naive, err := pgtest.OpenNaive(ctx, r.dsn, PoolSize)
	if err != nil {
		return stop, fmt.Errorf("naive baseline: %w", err)
	}
	stops = append(stops, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		err := naive.Drop(ctx)
		naive.Close()
		return err
	})
	if r.probe, err = pgtest.OpenProbe(ctx, r.dsn); err != nil {
		return stop, err
	}
	stops = append(stops, func() error { r.probe.Close(); return nil })
	for setting, into := range map[string]*string{"server_version": &m.PostgreSQL, "fsync": &m.Fsync, "synchronous_commit": &m.SynchronousCommit} {
		if *into, err = r.probe.Setting(ctx, setting); err != nil {
			return stop, err
		}
	}
	// Statistics are read only from the private cluster: a given database is someone's,
	// and neither its extensions nor its statistics are the bench's to change.
	if r.cfg.DatabaseURL == "" {
		if err := r.probe.EnableStatements(ctx); err == nil {
			r.statements = true
		} else {
			r.log.Info("pg_stat_statements is not available: the report will not list statements", "err", err)
		}
	}
	if m.Fsync != "on" || m.SynchronousCommit == "off" {
		r.log.Warn("PostgreSQL does not make commits durable: the comparison with JetStream sync_always is not fair",
			"fsync", m.Fsync, "synchronous_commit", m.SynchronousCommit)
	}

	r.prog.phase("starting jetgres and JetStream", 0, 0)
	jg := &benchTarget{name: TargetJetgres, url: r.cfg.URL}
	if jg.url == "" {
		push, pop, ack, err := defaultLanes()
		if err != nil {
			return stop, err
		}
		node, err := startJetgres(ctx, r.dsn, r.cfg.SynchronousCommit, push, pop, ack, r.log)
		if err != nil {
			return stop, err
		}
		stops = append(stops, node.stop)
		jg.url, jg.node = node.url(), node
	} else {
		m.Jetgres = "given by URL"
	}
	r.targets = append(r.targets, jg)
	for _, js := range []struct {
		name string
		sync bool
	}{{TargetJetStream, false}, {TargetJetStreamSync, true}} {
		s, err := jstwin.Start(jstwin.Config{StoreDir: filepath.Join(dir, js.name), SyncAlways: js.sync})
		if err != nil {
			return stop, err
		}
		stops = append(stops, func() error { s.Stop(); return nil })
		r.targets = append(r.targets, &benchTarget{name: js.name, url: s.ClientURL()})
	}
	r.targets = append(r.targets, &benchTarget{name: TargetPostgres, naive: naive})

	m.Cores = runtime.NumCPU()
	m.OS = runtime.GOOS + "/" + runtime.GOARCH
	m.Go = runtime.Version()
	m.NATSServer = server.VERSION
	m.NATSGo = natsGoVersion()
	m.CPU, m.MemoryGiB = cpuAndMemory()
	return stop, nil
}

// fail records a failed measurement; the run goes on with the next.
func (r *runner) fail(what string, t *benchTarget, err error) {
	msg := fmt.Sprintf("%s on %s: %v", what, t.name, err)
	r.rep.Errors = append(r.rep.Errors, msg)
	r.log.Warn("measurement failed", "section", what, "target", t.name, "err", err)
}

// cleanup runs an undo step after a measurement; a failure there is reported, since a stream
// left behind would skew the next measurement.
func (r *runner) cleanup(t *benchTarget, undo func(string) error, name string) {
	if err := undo(name); err != nil {
		r.fail("clean-up", t, err)
	}
}

// cpuAndMemory reads the CPU model and the memory size on Linux, and leaves them empty
// elsewhere: they describe the run, they are not needed for it.
func cpuAndMemory() (cpu string, gib int) {
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kb int
			if _, err := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); err == nil {
				gib = int((int64(kb)*1024 + 1<<29) >> 30)
				break
			}
		}
		f.Close()
	}
	return cpu, gib
}

// natsGoVersion is the nats.go release the client code is built with.
func natsGoVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/nats-io/nats.go" {
				return d.Version
			}
		}
	}
	return "unknown"
}
