// Command jetgres-bench measures jetgres against JetStream and a naive PostgreSQL queue in
// one run (see package bench) and prints the results table, or the report as JSON with
// --json; with --out-dir it also writes BENCHMARKS.md and its plots there, keeping the
// sections of the page it replaces that it does not write (the soak's):
//
//	go run ./cmd/jetgres-bench --out-dir .
//
// It is a command of its own so that the gateway's binary carries none of the load
// generator, the baseline's driver or the plotting library. Progress and logs go to stderr.
// A failed measurement is reported and makes the command fail after everything else has
// run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/jetgres/jetgres/e2e/bench"
)

// command is how the report names the command that regenerates it.
const command = "go run ./cmd/jetgres-bench"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a command line that cannot run.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// run returns the process exit code: 0 on success, 1 when the run or a measurement failed,
// 2 for a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	err := runBench(context.Background(), args, stdout, stderr)
	var usage usageError
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "jetgres-bench: %v\n", err)
	if errors.As(err, &usage) {
		return 2
	}
	return 1
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetgres-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	fs.IntVar(&cfg.NatsBenchMsgs, "natsbench-msgs", 0, fmt.Sprintf("messages of each nats bench throughput run; its runs of one operation at a time move a tenth (default %d, %s with --quick)", bench.NatsBenchMsgsDefault, "2000"))
	fs.IntVar(&cfg.KVKeys, "kv-keys", 0, fmt.Sprintf("keys of the push section's key-value bucket, read by kv.WatchAll (default %d, %s with --quick)", bench.KVKeysDefault, "2000"))
	fs.IntVar(&cfg.ObjectBytes, "object-bytes", 0, fmt.Sprintf("size in bytes of the object the push section gets (default %d, %s with --quick)", bench.ObjectBytesDefault, "4 MiB"))
	fs.StringVar(&cfg.SynchronousCommit, "synchronous-commit", "on", "--synchronous-commit of the in-process jetgres (on or off), or the one the jetgres given by --url runs with; the natsbench section measures both")
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
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	cfg.Only = strings.Split(only, ",")
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Command = strings.Join(append([]string{command}, args...), " ")
	cfg.Progress = stderr
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			cfg.ProgressTTY = fi.Mode()&os.ModeCharDevice != 0
		}
	}

	// Stopping the private PostgreSQL and the servers must happen even on Ctrl-C.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cpuProf != "" {
		f, err := os.Create(cpuProf)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if outDir != "" {
		if err := rep.WriteFiles(outDir); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "jetgres-bench: wrote BENCHMARKS.md and plots into %s in %s\n", outDir, time.Since(start).Round(time.Second))
	}
	if len(rep.Errors) > 0 {
		return fmt.Errorf("%d measurements failed (listed above)", len(rep.Errors))
	}
	return nil
}
