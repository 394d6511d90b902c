package bridge

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// warnEvery is how often a warning that fires on every failed attempt may reach the log.
// While the database is away every publish flush and consumer read fails, hundreds a
// second; one line per interval, with a count of the ones left out, says as much.
const warnEvery = 10 * time.Second

// logEvery thins one repeated warning: the first is logged, later ones within warnEvery of
// it are only counted, and the next one logged after that carries the count as
// "suppressed". It takes no lock, so it may be used under any of the bridge's locks.
// The zero value is ready.
type logEvery struct {
	next       atomic.Int64 // unix ns on the bridge's clock before which warnings are counted
	suppressed atomic.Int64
}

func (l *logEvery) warn(log *slog.Logger, now time.Time, msg string, args ...any) {
	t := now.UnixNano()
	next := l.next.Load()
	if t < next || !l.next.CompareAndSwap(next, t+int64(warnEvery)) {
		l.suppressed.Add(1)
		return
	}
	if n := l.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Warn(msg, args...)
}
