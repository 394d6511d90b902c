package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress shows what the run is doing. On a terminal it redraws one line in place four times a
// second: the phase, a bar, and the count and rate of what the phase moved. Elsewhere (a CI
// log, a file) it prints one line when a phase starts, so the log stays readable.
type progress struct {
	w   io.Writer
	tty bool

	mu    sync.Mutex
	label string
	start time.Time
	// A phase is done either by count (total > 0) or by time (span > 0).
	total int64
	span  time.Duration
	done  atomic.Int64

	stop chan struct{}
	wg   sync.WaitGroup
}

func newProgress(w io.Writer, tty bool) *progress {
	p := &progress{w: w, tty: tty, stop: make(chan struct{})}
	if w != nil && tty {
		p.wg.Go(p.redraw)
	}
	return p
}

// phase starts a phase that ends after total units or after span, whichever is given.
func (p *progress) phase(label string, total int64, span time.Duration) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	p.label, p.start, p.total, p.span = label, time.Now(), total, span
	p.done.Store(0)
	p.mu.Unlock()
	if !p.tty {
		fmt.Fprintf(p.w, "bench: %s\n", label)
	}
}

// add counts n units of the current phase.
func (p *progress) add(n int64) { p.done.Add(n) }

func (p *progress) redraw() {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			fmt.Fprint(p.w, "\r\033[K")
			return
		case <-t.C:
			fmt.Fprint(p.w, "\r\033[K"+p.line())
		}
	}
}

func (p *progress) line() string {
	p.mu.Lock()
	label, start, total, span := p.label, p.start, p.total, p.span
	p.mu.Unlock()
	if label == "" {
		return ""
	}
	elapsed := time.Since(start)
	done := p.done.Load()
	frac := 0.0
	switch {
	case total > 0:
		frac = float64(done) / float64(total)
	case span > 0:
		frac = elapsed.Seconds() / span.Seconds()
	}
	frac = min(max(frac, 0), 1)
	const width = 24
	fill := int(frac * width)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed.Seconds()
	}
	return fmt.Sprintf("%-44s [%s%s] %3.0f%% %9d  %s/s", label, strings.Repeat("=", fill),
		strings.Repeat(" ", width-fill), frac*100, done, humanRate(rate))
}

// close stops the redraw and clears the line.
func (p *progress) close() {
	close(p.stop)
	p.wg.Wait()
}

func humanRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk", r/1e3)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}
