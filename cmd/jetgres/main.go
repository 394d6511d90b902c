// Command jetgres is a NATS gateway that keeps JetStream streams in PostgreSQL.
//
// `jetgres serve` (also what a bare `jetgres` runs) starts the embedded NATS server, the
// bridge and the HTTP endpoints, with a private PostgreSQL cluster unless --database-url
// names one. `jetgres version` prints build information. Every flag has a JETGRES_*
// environment variable; `jetgres -h` lists them. The benchmark is a command of its own,
// cmd/jetgres-bench, so that this binary carries none of it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// usageHint follows a usage error instead of the whole flag list, which would push the error
// off the screen.
const usageHint = "Run 'jetgres -h' for the commands, flags and environment variables."

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run returns the process exit code: 0 on success, 1 when serving failed, 2 for a usage
// error.
func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		cfg, err := parseConfig(args, os.LookupEnv, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "jetgres: %v\n%s\n", err, usageHint)
			return 2
		}
		logger, err := newLogger(cfg, stderr, databaseSecrets(cfg.DatabaseURL))
		if err != nil {
			fmt.Fprintf(stderr, "jetgres: %v\n", err)
			return 2
		}
		// Signals stay caught for the whole run, not only until the first: a second Ctrl-C
		// must not kill jetgres halfway through stopping its PostgreSQL. The shutdown is
		// bounded by --shutdown-timeout instead.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		// After NotifyContext, so that the SIGTERM it may bring is a graceful stop.
		if goRun, err := stopWithGoRun(); err != nil {
			logger.Warn("jetgres will not stop when the go command running it exits: stop jetgres itself", "err", err)
		} else if goRun {
			logger.Debug("jetgres stops when the go command running it exits")
		}
		if err := serve(ctx, cfg, logger); err != nil {
			logger.Error("jetgres stopped with an error", "err", err)
			return 1
		}
		return 0
	case "version":
		if len(args) > 0 {
			fmt.Fprintf(stderr, "jetgres: version takes no arguments\n")
			return 2
		}
		fmt.Fprint(stdout, readBuildInfo())
		return 0
	case "help":
		var c config
		newFlagSet(&c, stdout).Usage()
		return 0
	default:
		fmt.Fprintf(stderr, "jetgres: unknown command %q\n%s\n", cmd, usageHint)
		return 2
	}
}
