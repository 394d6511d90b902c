package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// privateClusterStopTimeout bounds the stop of the private PostgreSQL on its own, apart from
// --shutdown-timeout: a slow drain earlier in the shutdown must not leave the cluster
// running.
const privateClusterStopTimeout = 20 * time.Second

// node is one running jetgres: every component, in start order.
type node struct {
	cfg config
	log *slog.Logger

	cluster *localpg.Cluster // nil with --database-url
	db      *pg.DB
	nats    *natsd.Server
	link    *leaf.Conn
	bridge  *bridge.Bridge
	appends *flow.Lane
	pop     *flow.Lane
	ack     *flow.Lane
	reg     *prometheus.Registry

	httpServer *http.Server
	httpAddr   net.Addr
	httpErr    chan error

	// draining turns /readyz to 503 as soon as shutdown begins, before anything stops.
	draining atomic.Bool

	// stops undo what start did, run in reverse order.
	stops []stopStep
}

type stopStep struct {
	name string
	stop func(ctx context.Context) error
}

// serve runs jetgres until ctx is cancelled or a component fails, then shuts down.
func serve(ctx context.Context, cfg config, logger *slog.Logger) error {
	n := &node{cfg: cfg, log: logger, reg: newRegistry(), httpErr: make(chan error, 1)}
	startErr := n.start(ctx)
	if startErr != nil && ctx.Err() != nil {
		// A signal during start-up is a request to stop, not a failure.
		n.log.Info("start-up interrupted", "err", startErr)
		startErr = nil
	} else if startErr == nil {
		startErr = n.wait(ctx)
	}
	if err := errors.Join(startErr, n.stop()); err != nil {
		return err
	}
	n.log.Info("jetgres stopped")
	return nil
}

func (n *node) onStop(name string, stop func(ctx context.Context) error) {
	n.stops = append(n.stops, stopStep{name, stop})
}

// start brings the components up in dependency order. Whatever started before a failure is
// left in n.stops for stop to undo.
func (n *node) start(ctx context.Context) error {
	cfg := n.cfg
	var err error

	// A mistake in the NATS security settings is found before the database starts.
	if err := natsConfig(cfg, "", 0, n.log).Check(); err != nil {
		return fmt.Errorf("NATS server: %w", err)
	}
	if n.appends, err = flow.NewLane("append", cfg.appendOptions()); err != nil {
		return fmt.Errorf("append lane: %w", err)
	}
	if n.pop, err = flow.NewLane("pop", cfg.popOptions()); err != nil {
		return fmt.Errorf("pop lane: %w", err)
	}
	// Cursor writes get a lane of their own with the append lane's bounds: see bridge.Config.Ack.
	if n.ack, err = flow.NewLane("ack", cfg.ackOptions()); err != nil {
		return fmt.Errorf("ack lane: %w", err)
	}
	n.reg.MustRegister(laneCollector(n.appends), laneCollector(n.pop), laneCollector(n.ack))

	dsn := cfg.DatabaseURL
	if dsn == "" {
		dir := filepath.Join(cfg.DataDir, "pg")
		n.log.Info("starting private PostgreSQL", "data_dir", dir)
		n.cluster, err = localpg.Start(ctx, localpg.Config{DataDir: dir, Logger: n.log,
			Restart: true, MaxFailedStarts: cfg.PGFailedStarts})
		var access *localpg.AccessError
		if errors.As(err, &access) {
			return fmt.Errorf("private PostgreSQL in %s: it runs as OS user %q, which cannot enter %s (mode %04o): "+
				"give --data-dir a directory outside %s (such as /var/lib/jetgres), or make %s traversable (chmod o+x %s)",
				dir, access.User, access.Dir, access.Mode, access.Dir, access.Dir, access.Dir)
		}
		if err != nil {
			return fmt.Errorf("private PostgreSQL in %s: %w", dir, err)
		}
		n.onStop("private PostgreSQL", func(context.Context) error {
			ctx, cancel := context.WithTimeout(context.Background(), privateClusterStopTimeout)
			defer cancel()
			if err := n.cluster.Stop(ctx); err != nil && n.cluster.Err() == nil {
				return err
			}
			// A cluster that could not come back has said why once, through wait.
			return nil
		})
		dsn = n.cluster.DSN()
		n.reg.MustRegister(clusterCollectors(n.cluster)...)
	}

	n.db, err = pg.Open(ctx, pg.Config{
		URL:               dsn,
		MaxConns:          int32(cfg.PoolSize),
		StmtTimeout:       cfg.StmtTimeout,
		SynchronousCommit: cfg.SyncCommit,
		Keepalive:         cfg.Lease,
		Logger:            n.log.With("component", "pg"),
	})
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	n.onStop("database pool", func(context.Context) error { n.db.Close(); return nil })
	n.reg.MustRegister(poolCollector(n.db))
	if err := n.db.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate schema: %w", err)
	}

	host, port, err := splitListen(cfg.Listen)
	if err != nil {
		return err
	}
	n.nats, err = natsd.Start(ctx, natsConfig(cfg, host, port, n.log))
	if err != nil {
		return fmt.Errorf("NATS server on %s: %w", cfg.Listen, err)
	}
	n.onStop("NATS server", func(context.Context) error { n.nats.Stop(); return nil })

	ep := n.nats.Leaf()
	n.link, err = leaf.Dial(ctx, leaf.Config{
		Addr:     ep.Addr,
		User:     ep.User,
		Password: ep.Password,
		Name:     "jetgres-bridge",
		Logger:   n.log,
	})
	if err != nil {
		return fmt.Errorf("leafnode link to the NATS server: %w", err)
	}
	n.onStop("leafnode link", func(context.Context) error { return n.link.Close() })
	n.reg.MustRegister(leafCollector(n.link))
	// Streams with a mirror or sources copy through a link of their own: the server never
	// hands a link what it sent itself, and their origins answer on the first.
	copyLink, err := leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password, Name: "jetgres-copy", Logger: n.log})
	if err != nil {
		return fmt.Errorf("leafnode link to the NATS server for copying: %w", err)
	}
	n.onStop("copy link", func(context.Context) error { return copyLink.Close() })

	br, err := bridge.New(bridge.Config{
		DB:                n.db,
		Link:              n.link,
		CopyLink:          copyLink,
		Append:            n.appends,
		Pop:               n.pop,
		Ack:               n.ack,
		Logger:            n.log.With("component", "bridge"),
		Registerer:        n.reg,
		IntakeBytes:       cfg.IntakeBytes,
		IntakeTotalBytes:  cfg.IntakeTotalBytes,
		TailTotalBytes:    cfg.TailTotalBytes,
		TickPeriod:        cfg.TickPeriod,
		FlushOverlapAfter: cfg.FlushOverlap,
		CursorInterval:    cfg.CursorInterval,
		ReplicaName:       replicaName(cfg.ReplicaName, n.nats.NATSServer().Addr().(*net.TCPAddr).Port),
		MaxPayload:        n.nats.MaxPayload(),
		Lease:             cfg.Lease,
		ClusterName:       n.nats.ClusterName(),
		Domain:            n.nats.Domain(),
		MaxMemory:         n.nats.JetStreamLimits().MaxMemory,
		MaxStore:          n.nats.JetStreamLimits().MaxStore,

		SubjectIndexBytes: cfg.SubjectIndexBytes,
	})
	if err != nil {
		return err
	}
	// Registered before Start: a Start that fails part-way has stopped what it started, and
	// Stop after it is safe.
	n.onStop("bridge", br.Stop)
	if err := br.Start(ctx); err != nil {
		return err
	}
	n.bridge = br
	n.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "jetgres_publish_oldest_flush_seconds",
		Help: "How long the oldest publish transaction in flight has been running; 0 with none. /readyz turns 503 beyond --ready-stall.",
	}, func() float64 { return br.OldestFlush(time.Now()).Seconds() }))

	if err := n.startHTTP(); err != nil {
		return err
	}

	natsURL := n.nats.ClientURL()
	if cfg.ReadyFile != "" {
		if err := writeReadyFile(cfg.ReadyFile, natsURL, n.httpAddr.String()); err != nil {
			return err
		}
		n.onStop("ready file", func(context.Context) error { return os.Remove(cfg.ReadyFile) })
	}
	database := "private cluster in " + filepath.Join(cfg.DataDir, "pg")
	if cfg.DatabaseURL != "" {
		database = redactDatabaseURL(cfg.DatabaseURL)
	}
	n.log.Info("jetgres ready", "nats", natsURL, "http", n.httpAddr.String(), "database", database)
	return nil
}

// replicaName is --replica-name, or its default <host>:<NATS port>: stable across restarts
// on a fixed port, and unique among replicas that share a host.
func replicaName(flag string, natsPort int) string {
	if flag != "" {
		return flag
	}
	hostname, _ := os.Hostname()
	return net.JoinHostPort(hostname, strconv.Itoa(natsPort))
}

// natsConfig is the embedded server's configuration.
func natsConfig(cfg config, host string, port int, log *slog.Logger) natsd.Config {
	return natsd.Config{
		Host: host, Port: port, Logger: log,
		Cluster:    natsd.ClusterConfig{Listen: cfg.Cluster, Routes: splitRoutes(cfg.Routes), Name: cfg.ClusterName},
		ConfigFile: cfg.NATSConfig, User: cfg.User, Password: cfg.Password,
		JetStreamDomain: cfg.JSDomain,
		TLS:             natsd.TLSConfig{Cert: cfg.TLSCert, Key: cfg.TLSKey, CA: cfg.TLSCA, Verify: cfg.TLSVerify},
	}
}

func splitRoutes(s string) []string {
	var out []string
	for r := range strings.SplitSeq(s, ",") {
		if r = strings.TrimSpace(r); r != "" {
			out = append(out, r)
		}
	}
	return out
}

// splitListen turns --listen into the embedded server's host and port. An empty host means
// every interface, as it does for net.Listen, where natsd would take loopback. Port 0 asks
// for a free port, which nats-server spells -1 (its 0 means 4222).
func splitListen(listen string) (string, int, error) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("--listen %q: %w", listen, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--listen %q: bad port", listen)
	}
	if port == 0 {
		port = -1
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

func (n *node) startHTTP() error {
	ln, err := net.Listen("tcp", n.cfg.HTTP)
	if err != nil {
		return fmt.Errorf("HTTP listener on %s: %w", n.cfg.HTTP, err)
	}
	n.httpAddr = ln.Addr()
	n.httpServer = &http.Server{
		Handler:           n.handler(n.reg),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(n.log.With("component", "http").Handler(), slog.LevelWarn),
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := n.httpServer.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			n.httpErr <- err
		}
	}()
	n.onStop("HTTP server", func(ctx context.Context) error {
		err := n.httpServer.Shutdown(ctx)
		// Shutdown closes the listener first, so Serve returns even when ctx ends early.
		<-served
		return err
	})
	return nil
}

// writeReadyFile writes the bound addresses where a supervisor or a test can find them.
// Writing a temporary file and renaming it means a reader never sees half a file.
func writeReadyFile(path, natsURL, httpAddr string) error {
	b, err := json.Marshal(struct {
		NATS string `json:"nats"`
		HTTP string `json:"http"`
	}{natsURL, httpAddr})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	return nil
}

// wait blocks until a signal or until a component that must stay up fails. jetgres cannot
// serve without any of them, so it exits and leaves the restart to its supervisor. The
// private PostgreSQL counts as failed only once it cannot come back: localpg restarts it
// while it can, and publishes are answered 503 meanwhile, as for an external database.
func (n *node) wait(ctx context.Context) error {
	var clusterDone <-chan struct{} // nil, so never ready, with --database-url
	if n.cluster != nil {
		clusterDone = n.cluster.Done()
	}
	select {
	case <-ctx.Done():
		n.log.Info("shutting down", "cause", context.Cause(ctx))
		return nil
	case err := <-n.httpErr:
		return fmt.Errorf("HTTP server: %w", err)
	case <-n.link.Done():
		return ended("leafnode link to the NATS server closed", n.link.Err())
	case <-clusterDone:
		return ended("private PostgreSQL cannot come back", n.cluster.Err())
	}
}

func ended(what string, cause error) error {
	if cause == nil {
		return errors.New(what)
	}
	return fmt.Errorf("%s: %w", what, cause)
}

// stop undoes start in reverse order. Every step runs even when an earlier one fails or the
// deadline has passed, so that nothing, least of all the private PostgreSQL, is left running.
func (n *node) stop() error {
	n.draining.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownTimeout)
	defer cancel()
	var errs []error
	for i := len(n.stops) - 1; i >= 0; i-- {
		s := n.stops[i]
		start := time.Now()
		if err := s.stop(ctx); err != nil {
			n.log.Warn("stop failed", "component", s.name, "err", err)
			errs = append(errs, fmt.Errorf("stop %s: %w", s.name, err))
			continue
		}
		n.log.Debug("stopped", "component", s.name, "took", time.Since(start))
	}
	n.stops = nil
	return errors.Join(errs...)
}
