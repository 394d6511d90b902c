package localpg

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"sync/atomic"
)

// adminTermination is how a backend reports that a fast shutdown ended its session. During a
// stop that Stop asked for it is routine, and logged at debug level; at any other time someone
// ended a session with pg_terminate_backend, and it stays a warning.
const adminTermination = "terminating connection due to administrator command"

// serverLine matches the prefix set by log_line_prefix ("[%p] ") and the severity.
var serverLine = regexp.MustCompile(`^\[(\d+)\] ([A-Z]+):  (.*)$`)

// severityLevel maps PostgreSQL severities to slog levels. ERROR is debug because it is what
// clients see anyway (a cancelled statement, a unique violation) and the caller handles it;
// FATAL is warn because it also covers routine events such as a forced DROP DATABASE ending
// its sessions.
func severityLevel(sev string) slog.Level {
	switch sev {
	case "PANIC":
		return slog.LevelError
	case "FATAL", "WARNING":
		return slog.LevelWarn
	default:
		return slog.LevelDebug
	}
}

// logServer copies the server's stderr to log, and its last lines to tail, until EOF, which
// comes when the postmaster and every backend (they inherit the descriptor) have exited.
// stopping is true once Stop has begun.
func logServer(r io.Reader, log *slog.Logger, tail *lineTail, stopping *atomic.Bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	ctx := context.Background()
	for sc.Scan() {
		line := sc.Text()
		tail.add(line)
		m := serverLine.FindStringSubmatch(line)
		if m == nil {
			// DETAIL, HINT and STATEMENT lines carry the prefix too; anything else is a
			// continuation line or output from before the settings applied.
			log.Log(ctx, slog.LevelDebug, line)
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		level := severityLevel(m[2])
		if m[3] == adminTermination && stopping.Load() {
			level = slog.LevelDebug
		}
		log.Log(ctx, level, m[3], "severity", m[2], "pid", pid)
	}
	// A scan error means the pipe broke or a line exceeded 1 MiB; drain so the server never
	// blocks writing to a full pipe.
	_, _ = io.Copy(io.Discard, r)
}
