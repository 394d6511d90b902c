// Package natsd owns the NATS server that jetgres embeds: it starts
// nats-server in-process with JetStream disabled (jetgres answers the
// JetStream API itself), opens a loopback-only leafnode listener with
// credentials generated at start-up for the bridge's link, routes the
// server's logging into log/slog, and stops it.
package natsd

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

const (
	// HostDefault is the client listener's default interface.
	HostDefault = "127.0.0.1"
	// PortDefault is the client listener's default port.
	PortDefault = server.DEFAULT_PORT
	// MaxPayloadDefault is the default limit on a message's headers plus
	// data, the server's own default.
	MaxPayloadDefault = server.MAX_PAYLOAD_SIZE
	// ReadyTimeoutDefault bounds Start when its context has no deadline.
	ReadyTimeoutDefault = 10 * time.Second

	// leafHost is not configurable: the leafnode port carries the bridge's
	// privileged link (exempt from the reserved-reply check), so it must
	// never be reachable from another machine.
	leafHost = "127.0.0.1"
	// globalAccount is the account the leaf binds to when no other is set.
	globalAccount = server.DEFAULT_GLOBAL_ACCOUNT
)

// Config configures the embedded server. The zero value is usable.
type Config struct {
	// Host is the interface the client listener binds to.
	// Defaults to HostDefault (loopback only).
	Host string

	// Port is the client listener's port; -1 picks a free port.
	// Defaults to PortDefault (4222).
	Port int

	// MaxPayload limits a message's headers plus data, in bytes.
	// Defaults to MaxPayloadDefault (1 MiB).
	MaxPayload int32

	// Logger receives the server's log lines.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// ServerOptions, when set, may adjust the server options just before
	// the server is created, for example to add users, accounts or TLS for
	// client connections, or to switch on Debug or Trace logging. The
	// leafnode listener's address, credentials and plain-TCP transport,
	// NoSigs and the disabled JetStream are re-applied afterwards: the
	// bridge depends on them. Defaults to nil (no adjustment).
	ServerOptions func(*server.Options)
}

// LeafEndpoint is where and how the bridge attaches as a leafnode.
// Its String and LogValue methods redact the password.
type LeafEndpoint struct {
	// Addr is host:port on the loopback interface.
	Addr string
	// User and Password are generated at start-up and live only in memory.
	User     string
	Password string
}

// String implements fmt.Stringer without revealing the password.
func (e LeafEndpoint) String() string {
	return fmt.Sprintf("leaf{addr=%s user=%s password=REDACTED}", e.Addr, e.User)
}

// GoString implements fmt.GoStringer (%#v) without revealing the password.
func (e LeafEndpoint) GoString() string { return e.String() }

// LogValue implements slog.LogValuer without revealing the password.
func (e LeafEndpoint) LogValue() slog.Value {
	return slog.GroupValue(slog.String("addr", e.Addr), slog.String("user", e.User))
}

// Server is a running embedded NATS server.
type Server struct {
	ns         *server.Server
	leaf       LeafEndpoint
	maxPayload int32
	stopOnce   sync.Once
}

// Start creates and starts the server and returns once both the client and
// the leafnode listeners accept connections. Cancelling ctx aborts the wait
// and shuts the server down again; without a deadline on ctx the wait is
// bounded by ReadyTimeoutDefault.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()

	user, err := randomToken(12)
	if err != nil {
		return nil, fmt.Errorf("natsd: generate leaf user: %w", err)
	}
	pass, err := randomToken(32)
	if err != nil {
		return nil, fmt.Errorf("natsd: generate leaf password: %w", err)
	}

	opts := &server.Options{
		Host:       cfg.Host,
		Port:       cfg.Port,
		MaxPayload: cfg.MaxPayload,
	}
	if cfg.ServerOptions != nil {
		cfg.ServerOptions(opts)
	}
	enforceBridgeOptions(opts, user, pass)

	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsd: create server: %w", err)
	}
	s := &Server{ns: ns, maxPayload: opts.MaxPayload}
	logs := newLogAdapter(cfg.Logger)
	ns.SetLoggerV2(logs, opts.Debug || cfg.Logger.Enabled(ctx, slog.LevelDebug), opts.Trace, opts.TraceVerbose)
	ns.Start()

	if err := waitReady(ctx, ns, logs.fatal); err != nil {
		s.Stop()
		return nil, err
	}

	port, err := leafPort(ns)
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.leaf = LeafEndpoint{
		Addr:     net.JoinHostPort(leafHost, strconv.Itoa(port)),
		User:     user,
		Password: pass,
	}
	return s, nil
}

func (cfg Config) withDefaults() Config {
	if cfg.Host == "" {
		cfg.Host = HostDefault
	}
	if cfg.Port == 0 {
		cfg.Port = PortDefault
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = MaxPayloadDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// enforceBridgeOptions applies what the bridge relies on, after any
// caller adjustment.
func enforceBridgeOptions(opts *server.Options, user, pass string) {
	opts.NoSigs = true
	opts.JetStream = false
	if opts.MaxPayload == 0 {
		opts.MaxPayload = MaxPayloadDefault
	}

	opts.LeafNode.Host = leafHost
	opts.LeafNode.Port = -1
	opts.LeafNode.Username = user
	opts.LeafNode.Password = pass
	opts.LeafNode.Users = nil
	opts.LeafNode.Nkey = ""
	// The link speaks plain TCP; loopback needs no TLS.
	opts.LeafNode.TLSConfig = nil
	opts.LeafNode.TLSHandshakeFirst = false
	// Keeps the loopback address out of the URLs the server gossips to
	// routes and other leafnodes.
	opts.LeafNode.NoAdvertise = true
	// Compression buys nothing on loopback and the link does not speak S2.
	opts.LeafNode.Compression = server.CompressionOpts{Mode: server.CompressionOff}

	// With JetStream disabled the server denies $JS.API.> on leaf
	// connections unless the leaf's account has an empty default domain.
	acc := opts.LeafNode.Account
	if acc == "" {
		acc = globalAccount
	}
	if opts.JsAccDefaultDomain == nil {
		opts.JsAccDefaultDomain = make(map[string]string)
	}
	opts.JsAccDefaultDomain[acc] = ""
}

func waitReady(ctx context.Context, ns *server.Server, fatal *fatalNote) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(ReadyTimeoutDefault)
	}
	// ReadyForConnections cannot be interrupted, so poll it in short slices
	// to honour ctx and to notice a fatal listener error early. Slices must
	// exceed 25 ms, its sleep step, or it spins.
	const slice = 50 * time.Millisecond
	for {
		if ns.ReadyForConnections(slice) {
			return nil
		}
		select {
		case <-fatal.ch:
			return fmt.Errorf("natsd: start: %s", fatal.msg)
		default:
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("natsd: wait for listeners: %w", err)
		}
		if time.Now().After(deadline) {
			return errors.New("natsd: listeners not ready before the deadline")
		}
		if !ns.Running() {
			return errors.New("natsd: server stopped while starting")
		}
	}
}

func leafPort(ns *server.Server) (int, error) {
	vz, err := ns.Varz(nil)
	if err != nil {
		return 0, fmt.Errorf("natsd: read leafnode port: %w", err)
	}
	if vz.LeafNode.Port <= 0 {
		return 0, fmt.Errorf("natsd: leafnode listener has no port")
	}
	return vz.LeafNode.Port, nil
}

func randomToken(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// ClientURL is the URL NATS clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Leaf reports where the bridge attaches as a leafnode and with which
// credentials.
func (s *Server) Leaf() LeafEndpoint { return s.leaf }

// MaxPayload is the largest message (headers plus data) the server accepts.
func (s *Server) MaxPayload() int32 { return s.maxPayload }

// Ready reports whether the server is running: true from a successful Start
// until Stop or an internal shutdown.
func (s *Server) Ready() bool { return s.ns.Running() }

// Stop shuts the server down and waits until it has. Safe to call more than
// once and concurrently.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
}

// NATSServer exposes the underlying server, for tests and monitoring.
func (s *Server) NATSServer() *server.Server { return s.ns }
