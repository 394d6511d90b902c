package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/jetgres/jetgres/e2e/bench"
)

// runBench is `jetgres bench`: it measures jetgres against JetStream and a naive PostgreSQL
// baseline in one run (see package bench) and prints the results table, or the report as
// JSON with --json; with --out-dir it also writes BENCHMARKS.md and its plots there.
// Progress and logs go to stderr. A failed measurement is reported and makes the command
// fail after everything else has run.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("jetgres bench", flag.ContinueOnError)
	var (
		cfg      bench.Config
		only     string
		asJSON   bool
		outDir   string
		logLevel string
		cpuProf  string
	)
	fs.IntVar(&cfg.Msgs, "msgs", 0, fmt.Sprintf("messages per throughput phase (default %d, %s with --quick)", bench.MsgsDefault, "20000"))
	fs.IntVar(&cfg.Size, "size", bench.SizeDefault, "payload size in bytes (at least 8)")
	fs.DurationVar(&cfg.Duration, "duration", 0, fmt.Sprintf("time limit of each timed phase (default %s, 2s with --quick)", bench.DurationDefault))
	fs.IntVar(&cfg.Window, "window", bench.WindowDefault, "async publish window: PubAcks outstanding at once")
	fs.BoolVar(&cfg.Quick, "quick", false, "a CI-sized smoke run of every section, well under a minute")
	fs.StringVar(&only, "only", strings.Join(bench.Sections, ","), "comma-separated sections to run: "+strings.Join(bench.Sections, ", "))
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "a running PostgreSQL (Unix socket or loopback) instead of a private cluster in a temporary directory")
	fs.StringVar(&cfg.URL, "url", "", "a running jetgres (nats://host:port on loopback) instead of one started in-process; skips the fixed-concurrency overload run")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON instead of the table")
	fs.StringVar(&outDir, "out-dir", "", "write BENCHMARKS.md and the plots (under "+bench.PlotDir+") into this directory")
	fs.StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the whole run (bench, in-process jetgres and JetStream) to this file, for go tool pprof")
	fs.StringVar(&logLevel, "log-level", "error", "log level of the components on stderr: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	}
	cfg.Only = strings.Split(only, ",")
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("bench: --log-level: %w", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Command = strings.Join(append([]string{"jetgres bench"}, args...), " ")
	cfg.Progress = os.Stderr
	if fi, err := os.Stderr.Stat(); err == nil {
		cfg.ProgressTTY = fi.Mode()&os.ModeCharDevice != 0
	}

	// Stopping the private PostgreSQL and the servers must happen even on Ctrl-C.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cpuProf != "" {
		f, err := os.Create(cpuProf)
		if err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteText(os.Stdout)
	}
	if err != nil {
		return fmt.Errorf("bench: write report: %w", err)
	}
	if outDir != "" {
		if err := rep.WriteFiles(outDir); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fmt.Fprintf(os.Stderr, "bench: wrote BENCHMARKS.md and plots into %s in %s\n", outDir, time.Since(start).Round(time.Second))
	}
	if len(rep.Errors) > 0 {
		return fmt.Errorf("bench: %d measurements failed (listed above)", len(rep.Errors))
	}
	return nil
}
