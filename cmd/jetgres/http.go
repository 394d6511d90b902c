package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readyPingTimeout is how long /readyz waits for PostgreSQL before calling it unready.
const readyPingTimeout = time.Second

// diskFullHold is how long /readyz stays unready after PostgreSQL last refused a write for
// its full disk. Publishers retrying keep the refusals coming while the disk stays full; once
// space is freed the refusals stop and readiness returns after this long.
const diskFullHold = 5 * time.Second

func (n *node) handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:          slogPrinter{n},
		Registry:          reg,
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writePlain(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if reason := n.notReady(r.Context()); reason != "" {
			writePlain(w, http.StatusServiceUnavailable, reason)
			return
		}
		writePlain(w, http.StatusOK, "ready")
	})
	return mux
}

// notReady returns why jetgres cannot serve clients right now, or "" when it can.
func (n *node) notReady(ctx context.Context) string {
	if n.draining.Load() {
		return "shutting down"
	}
	if !n.nats.Ready() {
		return "nats: not accepting connections"
	}
	select {
	case <-n.link.Done():
		return "nats: leafnode link closed"
	default:
	}
	if n.cluster != nil && n.cluster.DiskFull() {
		return "postgresql: the private server cannot start, its disk is full"
	}
	if n.cluster != nil && !n.cluster.Up() {
		return "postgresql: the private server is restarting"
	}
	// A full disk leaves the ping below answering: only the writes it refuses show it.
	if at := n.db.LastDiskFull(); !at.IsZero() && time.Since(at) < diskFullHold {
		return fmt.Sprintf("postgresql: disk full (a write was refused %s ago)", time.Since(at).Round(time.Millisecond))
	}
	// A hung commit leaves the ping below answering: only the age of the oldest publish
	// transaction shows that every publish is timing out.
	if age := n.bridge.OldestFlush(time.Now()); age > n.cfg.ReadyStall {
		return fmt.Sprintf("postgresql: a publish transaction has not committed for %s (--ready-stall %s)",
			age.Round(time.Millisecond), n.cfg.ReadyStall)
	}
	ctx, cancel := context.WithTimeout(ctx, readyPingTimeout)
	defer cancel()
	if err := n.db.Ping(ctx); err != nil {
		n.log.Warn("readiness: PostgreSQL ping failed", "err", err)
		return "postgresql: not answering"
	}
	return ""
}

func writePlain(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	fmt.Fprintln(w, body)
}

// slogPrinter routes promhttp's error log through the process logger.
type slogPrinter struct{ n *node }

func (p slogPrinter) Println(v ...any) {
	p.n.log.Warn("metrics: "+fmt.Sprint(v...), "component", "http")
}
