// Package natsd owns the NATS server that jetgres embeds: it starts
// nats-server in-process with JetStream disabled (jetgres answers the
// JetStream API itself), opens a loopback-only leafnode listener with
// credentials generated at start-up for the bridge's link, applies the
// client security the operator asks for (a nats-server configuration file,
// a user, TLS), makes jetgres a JetStream domain of its own on the NATS
// network the server joins through leafnode remotes (domain.go), routes the
// server's logging into log/slog, and stops it.
//
// Client permissions govern the JetStream API too: the bridge receives an
// API request only after the server has let the client publish it, and its
// answer reaches the client only through the client's own subscription.
package natsd

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
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
	// maxControlLine leaves room for the protocol verb and sizes on a line
	// of the link.
	maxControlLine = leaf.MaxControlLine / 2
)

// Config configures the embedded server. The zero value is usable.
type Config struct {
	// Host is the interface the client listener binds to.
	// Defaults to HostDefault (loopback only).
	Host string

	// Port is the client listener's port; -1 picks a free port.
	// Defaults to PortDefault (4222).
	Port int

	// MaxPayload limits a message's headers plus data, in bytes. Zero takes
	// ConfigFile's max_payload. Defaults to MaxPayloadDefault (1 MiB).
	MaxPayload int32

	// ConfigFile names a configuration file in nats-server's own format,
	// read with server.ProcessConfigFile: users with passwords (plain or
	// bcrypt) or nkeys, per-user publish and subscribe permissions, TLS,
	// limits. What jetgres decides itself wins over it: the client
	// listener (Host and Port), JetStream (off) and the leafnode listener
	// (the bridge's). Leafnode remotes join other NATS systems, with
	// jetgres's JetStream walled off from theirs (see JetStreamDomain);
	// gateways are refused. Clients must be in the global account (users under
	// authorization, not under accounts), where the bridge serves JetStream;
	// operator (JWT) mode is refused. Defaults to "" (no file).
	ConfigFile string

	// User and Password, when User is set, admit clients that log in with
	// them, with every permission. Password may be a bcrypt hash, which the
	// server compares against. They add to ConfigFile's users.
	// Defaults to "" (no such user).
	User     string
	Password string

	// TLS makes clients connect with TLS when TLS.Cert is set. It cannot be
	// combined with a tls block in ConfigFile. Defaults to no TLS.
	TLS TLSConfig

	// Cluster, when Cluster.Listen is set, joins this server to a NATS cluster of
	// jetgres replicas through routes. Route TLS and authorization come from
	// ConfigFile's cluster block; Cluster's fields win over the ones it names.
	// Defaults to no cluster (or ConfigFile's).
	Cluster ClusterConfig

	// Logger receives the server's log lines.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// JetStreamDomain is the JetStream domain jetgres answers as, nats-server's
	// jetstream.domain: clients anywhere on the NATS network this server joins
	// reach jetgres's API as $JS.<domain>.API. It wins over ConfigFile's
	// jetstream block. Whatever the domain, jetgres's own clients' API requests
	// stay inside jetgres: see domain.go. Defaults to "" (ConfigFile's, else
	// none).
	JetStreamDomain string

	// ServerOptions, when set, may adjust the server options just before
	// the server is created, for example to add users, accounts or TLS for
	// client connections, or to switch on Debug or Trace logging. The
	// leafnode listener's address, credentials and plain-TCP transport,
	// NoSigs and the disabled JetStream are re-applied afterwards: the
	// bridge depends on them. Defaults to nil (no adjustment).
	ServerOptions func(*server.Options)
}

// TLSConfig is TLS for client connections, as PEM files.
type TLSConfig struct {
	// Cert is the server's certificate, followed by any intermediates.
	Cert string
	// Key is Cert's private key.
	Key string
	// CA holds the authorities that client certificates must chain to
	// when Verify is set; empty means the system's.
	CA string
	// Verify requires every client to present a valid certificate.
	Verify bool
}

// ClusterConfig is the route side of a cluster, in nats-server's terms.
type ClusterConfig struct {
	// Listen is host:port of the route listener; port 0 picks a free one.
	Listen string
	// Routes are the other servers' route URLs (nats://host:port).
	Routes []string
	// Name is the cluster's name, the same on every server.
	Name string
}

// A route whose network fell silent (a partition, not a closed connection) is closed after
// routeMaxPingsOut pings of routePingInterval go unanswered, seconds rather than the minute
// and more of nats-server's defaults: until it is closed, the queue group hands publishes
// and API requests to the replica behind it, and they are lost. A configuration file's
// cluster ping_interval and ping_max win.
const (
	routePingInterval = 2 * time.Second
	routeMaxPingsOut  = 2
)

// apply sets the route listener, routes, name and route pings on opts.
func (cc ClusterConfig) apply(opts *server.Options) error {
	if cc.Listen == "" {
		if len(cc.Routes) > 0 {
			return errors.New("natsd: Cluster.Routes needs Cluster.Listen")
		}
		return nil
	}
	if opts.Cluster.PingInterval == 0 {
		opts.Cluster.PingInterval = routePingInterval
	}
	if opts.Cluster.MaxPingsOut == 0 {
		opts.Cluster.MaxPingsOut = routeMaxPingsOut
	}
	host, p, err := net.SplitHostPort(cc.Listen)
	if err != nil {
		return fmt.Errorf("natsd: Cluster.Listen %q: %w", cc.Listen, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return fmt.Errorf("natsd: Cluster.Listen %q: bad port", cc.Listen)
	}
	if port == 0 {
		port = -1
	}
	if host == "" {
		host = "0.0.0.0"
	}
	opts.Cluster.Host, opts.Cluster.Port = host, port
	if cc.Name != "" {
		opts.Cluster.Name = cc.Name
	}
	if len(cc.Routes) > 0 {
		opts.Routes = opts.Routes[:0]
		for _, r := range cc.Routes {
			u, err := url.Parse(strings.TrimSpace(r))
			if err != nil || u.Host == "" {
				return fmt.Errorf("natsd: route %q is not a URL such as nats://host:6222", r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	return nil
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
	jsLimits   JetStreamLimits
	domain     string
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

	opts, err := cfg.serverOptions()
	if err != nil {
		return nil, err
	}
	if cfg.ServerOptions != nil {
		cfg.ServerOptions(opts)
	}
	// The configuration's JetStream resources bound what jetgres stores, as they bound a
	// JetStream server's; the server itself runs without JetStream.
	limits := JetStreamLimits{MaxMemory: max(opts.JetStreamMaxMemory, 0), MaxStore: max(opts.JetStreamMaxStore, 0)}
	enforceBridgeOptions(opts, user, pass, cfg.Logger)
	if err := applyDomain(opts, cfg.Logger); err != nil {
		return nil, err
	}
	logSecurity(opts, cfg.Logger)

	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsd: create server: %w", err)
	}
	s := &Server{ns: ns, maxPayload: opts.MaxPayload, jsLimits: limits, domain: opts.JetStreamDomain}
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

// Check reads ConfigFile and the TLS files and reports what Start would
// refuse in them, without starting anything: callers can fail fast, before
// starting what takes longer.
func (cfg Config) Check() error {
	cfg = cfg.withDefaults()
	cfg.Logger = slog.New(slog.DiscardHandler)
	_, err := cfg.serverOptions()
	return err
}

func (cfg Config) withDefaults() Config {
	if cfg.Host == "" {
		cfg.Host = HostDefault
	}
	if cfg.Port == 0 {
		cfg.Port = PortDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// serverOptions builds the server options from ConfigFile, then the
// listener, the user and TLS that Config names.
func (cfg Config) serverOptions() (*server.Options, error) {
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		fo, err := server.ProcessConfigFile(cfg.ConfigFile)
		if err != nil {
			// Most of the parser's errors name the file, but not all.
			if strings.Contains(err.Error(), cfg.ConfigFile) {
				return nil, fmt.Errorf("natsd: config file: %w", err)
			}
			return nil, fmt.Errorf("natsd: config file %s: %w", cfg.ConfigFile, err)
		}
		if err := checkFileOptions(fo); err != nil {
			return nil, fmt.Errorf("natsd: config file %s: %w", cfg.ConfigFile, err)
		}
		if fo.Port != 0 && fo.Port != cfg.Port || fo.Host != "" && fo.Host != cfg.Host {
			cfg.Logger.Warn("the NATS config file's listen address is ignored; jetgres listens where it is told to",
				"file", cfg.ConfigFile, "host", cfg.Host, "port", cfg.Port)
		}
		opts = fo
	}
	opts.Host, opts.Port = cfg.Host, cfg.Port
	if cfg.MaxPayload != 0 {
		opts.MaxPayload = cfg.MaxPayload
	}
	if cfg.JetStreamDomain != "" {
		opts.JetStreamDomain = cfg.JetStreamDomain
	}
	if err := checkDomain(opts.JetStreamDomain); err != nil {
		return nil, err
	}
	if err := cfg.Cluster.apply(opts); err != nil {
		return nil, err
	}
	if cfg.User != "" {
		if err := addUser(opts, cfg.User, cfg.Password); err != nil {
			return nil, err
		}
	}
	if cfg.TLS.Cert != "" || cfg.TLS.Key != "" {
		if opts.TLSConfig != nil {
			return nil, errors.New("natsd: TLS is set both in the config file and in Config.TLS; use one")
		}
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: cfg.TLS.Cert, KeyFile: cfg.TLS.Key, CaFile: cfg.TLS.CA, Verify: cfg.TLS.Verify,
		})
		if err != nil {
			return nil, fmt.Errorf("natsd: TLS: %w", err)
		}
		opts.TLSConfig, opts.TLSVerify = tc, cfg.TLS.Verify
		opts.TLSCert, opts.TLSKey, opts.TLSCaCert = cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA
	} else if cfg.TLS.CA != "" || cfg.TLS.Verify {
		return nil, errors.New("natsd: TLS.CA and TLS.Verify need TLS.Cert and TLS.Key")
	}
	return opts, nil
}

// checkFileOptions refuses what a config file may say but jetgres cannot
// serve. The bridge answers JetStream in one account, the global one: a
// client bound to any other would find no JetStream there.
func checkFileOptions(o *server.Options) error {
	if len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 {
		return errors.New("operator (JWT) mode is not supported; define users under authorization")
	}
	if err := checkGateways(o); err != nil {
		return err
	}
	for _, a := range o.Accounts {
		if a.Name != o.SystemAccount && a.Name != globalAccount {
			return fmt.Errorf("account %q: jetgres serves JetStream to the global account only; define its users under authorization, not under accounts", a.Name)
		}
	}
	if a := o.LeafNode.Account; a != "" && a != globalAccount {
		return fmt.Errorf("leafnodes account %q: the leafnode listener is the bridge's, in the global account", a)
	}
	return nil
}

// addUser admits one more user with every permission. nats-server takes
// either a single user or a list, so a single one from the file joins the
// list.
func addUser(opts *server.Options, user, pass string) error {
	if opts.Authorization != "" {
		return errors.New("natsd: a user cannot be added to token authorization")
	}
	if opts.Username != "" {
		opts.Users = append(opts.Users, &server.User{Username: opts.Username, Password: opts.Password})
		opts.Username, opts.Password = "", ""
	}
	for _, u := range opts.Users {
		if u.Username == user {
			return fmt.Errorf("natsd: user %q is also defined in the config file", user)
		}
	}
	opts.Users = append(opts.Users, &server.User{Username: user, Password: pass})
	return nil
}

// logSecurity says how clients authenticate, and warns when anyone who can
// reach the listener is let in.
func logSecurity(opts *server.Options, l *slog.Logger) {
	var auth []string
	if n := len(opts.Users); n > 0 {
		auth = append(auth, fmt.Sprintf("%d users", n))
	}
	if n := len(opts.Nkeys); n > 0 {
		auth = append(auth, fmt.Sprintf("%d nkeys", n))
	}
	if opts.Username != "" {
		auth = append(auth, "1 user")
	}
	if opts.Authorization != "" {
		auth = append(auth, "token")
	}
	if opts.AuthCallout != nil || opts.CustomClientAuthentication != nil {
		auth = append(auth, "external")
	}
	l.Info("NATS client security", "auth", strings.Join(auth, ", "), "tls", opts.TLSConfig != nil, "tls_verify", opts.TLSVerify)
	loopback := opts.Host == "localhost"
	if ip := net.ParseIP(opts.Host); ip != nil {
		loopback = ip.IsLoopback()
	}
	if len(auth) == 0 && !loopback {
		l.Warn("NATS clients need no credentials, and the listener is not on loopback", "host", opts.Host)
	}
}

// enforceBridgeOptions applies what the bridge relies on, after any
// caller adjustment.
func enforceBridgeOptions(opts *server.Options, user, pass string, l *slog.Logger) {
	opts.NoSigs = true
	if opts.JetStream {
		l.Info("JetStream in the NATS configuration: jetgres serves JetStream from PostgreSQL, within its max_memory_store and max_file_store")
	}
	opts.JetStream = false
	if opts.MaxPayload == 0 {
		opts.MaxPayload = MaxPayloadDefault
	}
	// Every message to the bridge crosses the link with its subject and
	// reply on one protocol line, which the link's parser bounds.
	if opts.MaxControlLine > maxControlLine {
		l.Warn("max_control_line lowered to what the bridge's link accepts", "asked", opts.MaxControlLine, "max", maxControlLine)
		opts.MaxControlLine = maxControlLine
	}
	if opts.LeafNode.Port != 0 || opts.LeafNode.Host != "" {
		l.Warn("the leafnode listener in the NATS configuration is ignored; it is the bridge's")
	}

	opts.LeafNode.Host = leafHost
	opts.LeafNode.Port = -1
	opts.LeafNode.Username = user
	opts.LeafNode.Password = pass
	opts.LeafNode.Users = nil
	opts.LeafNode.Nkey = ""
	opts.LeafNode.ProxyRequired = false
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

// ClusterURL is the URL other servers route to, or "" without a cluster.
func (s *Server) ClusterURL() string {
	if a := s.ns.ClusterAddr(); a != nil {
		return "nats://" + a.String()
	}
	return ""
}

// ClusterName is the NATS cluster's name, or "" without a cluster.
func (s *Server) ClusterName() string {
	if s.ns.ClusterAddr() == nil {
		return ""
	}
	return s.ns.ClusterName()
}

// ClientURL is the URL NATS clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Leaf reports where the bridge attaches as a leafnode and with which
// credentials.
func (s *Server) Leaf() LeafEndpoint { return s.leaf }

// MaxPayload is the largest message (headers plus data) the server accepts.
func (s *Server) MaxPayload() int32 { return s.maxPayload }

// Domain is the JetStream domain jetgres answers as, "" for none.
func (s *Server) Domain() string { return s.domain }

// JetStreamLimits are the JetStream resources of the configuration (its jetstream block's
// max_memory_store and max_file_store), in bytes, 0 where none is set.
type JetStreamLimits struct{ MaxMemory, MaxStore int64 }

// JetStreamLimits reports the configuration's JetStream resources.
func (s *Server) JetStreamLimits() JetStreamLimits { return s.jsLimits }

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
