// Package warnlog owns the thinning of warnings that repeat on every failed attempt (a
// database that is away fails every flush, read and tick): one line per interval, with a
// count of those left out.
package warnlog

import (
	"log/slog"
	"sync"
	"time"
)

// Every is how often a warning that fires on every failed attempt may reach the log.
// While the database is away every publish flush and consumer read fails, hundreds a
// second; one line per interval, with a count of the ones left out, says as much.
const Every = 10 * time.Second

// Throttle thins one repeated warning: the first is logged, later ones within Every of it
// are only counted, and the next one logged after that carries the count as "suppressed".
// Its lock is held for a few instructions and never while logging, and nothing is taken
// under it, so it may be used under any other lock. It was lock-free
// once: a warning counted between another's winning the interval and its taking the count
// was reported a line early. The zero value is ready.
type Throttle struct {
	mu         sync.Mutex
	next       int64 // unix ns on the caller's clock before which warnings are counted
	suppressed int64
}

// Warn logs msg at warning level unless one was logged within Every of now, a time of the
// caller's clock.
func (l *Throttle) Warn(log *slog.Logger, now time.Time, msg string, args ...any) {
	t := now.UnixNano()
	l.mu.Lock()
	if t < l.next {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.next = t + int64(Every)
	n := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Warn(msg, args...)
}
