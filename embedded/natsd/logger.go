package natsd

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// levelTrace sits below Debug so that protocol traces, when switched on
// through ServerOptions, stay out of ordinary debug output.
const levelTrace = slog.LevelDebug - 4

// defaultJSDomainWarning is what the server says at every start about default_js_domain,
// which enforceBridgeOptions sets itself; an operator can do nothing about it, so it is
// logged at debug level.
const defaultJSDomainWarning = "The option `default_js_domain` is a temporary backwards compatibility measure and will be removed"

// logAdapter implements server.Logger on top of slog.
type logAdapter struct {
	l     *slog.Logger
	fatal *fatalNote
}

// fatalNote keeps the first fatal message so that Start can fail at once
// with it instead of waiting out its deadline.
type fatalNote struct {
	once sync.Once
	ch   chan struct{}
	msg  string
}

func newLogAdapter(l *slog.Logger) logAdapter {
	return logAdapter{
		l:     l.With(slog.String("component", "nats-server")),
		fatal: &fatalNote{ch: make(chan struct{})},
	}
}

func (a logAdapter) Noticef(format string, v ...any) { a.log(slog.LevelInfo, format, v) }
func (a logAdapter) Warnf(format string, v ...any) {
	level := slog.LevelWarn
	if format == defaultJSDomainWarning {
		level = slog.LevelDebug
	}
	a.log(level, format, v)
}
func (a logAdapter) Errorf(format string, v ...any) { a.log(slog.LevelError, format, v) }
func (a logAdapter) Debugf(format string, v ...any) { a.log(slog.LevelDebug, format, v) }
func (a logAdapter) Tracef(format string, v ...any) { a.log(levelTrace, format, v) }

// Fatalf logs at error level and returns. The server's own logger exits the
// process here; in an embedded server the failure surfaces instead through
// the readiness check in Start or through Ready.
func (a logAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	a.l.Error(msg, slog.Bool("fatal", true))
	a.fatal.once.Do(func() {
		a.fatal.msg = msg
		close(a.fatal.ch)
	})
}

func (a logAdapter) log(level slog.Level, format string, v []any) {
	if !a.l.Enabled(context.Background(), level) {
		return
	}
	a.l.Log(context.Background(), level, fmt.Sprintf(format, v...))
}
