package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// config is everything `jetgres serve` can be told.
type config struct {
	Listen           string
	HTTP             string
	DataDir          string
	DatabaseURL      string
	PGFailedStarts   int
	LogFormat        string
	LogLevel         string
	PoolSize         int
	StmtTimeout      time.Duration
	SyncCommit       string
	AppendLimitInit  int
	AppendLimitMin   int
	AppendLimitMax   int
	PopLimitInit     int
	PopLimitMin      int
	PopLimitMax      int
	AckLimitInit     int
	AckLimitMin      int
	AckLimitMax      int
	AppendVegasAlpha float64
	AppendVegasBeta  float64
	VegasAlpha       float64
	VegasBeta        float64
	FlushOverlap     time.Duration
	TickPeriod       time.Duration
	CursorInterval   time.Duration
	IntakeBytes      int
	IntakeTotalBytes int
	TailTotalBytes   int
	ReplicaName      string
	ReadyFile        string
	ReadyStall       time.Duration
	ShutdownTimeout  time.Duration

	SubjectIndexBytes int

	// NATS client security.
	NATSConfig string
	User       string
	Password   string
	TLSCert    string
	TLSKey     string
	TLSCA      string
	TLSVerify  bool

	// Several replicas: the embedded servers' NATS cluster and consumer ownership.
	Cluster     string
	Routes      string
	ClusterName string
	Lease       time.Duration

	// JSDomain is the JetStream domain jetgres answers as on the NATS network.
	JSDomain string
}

// setting describes one flag. Every setting lives in this one table so that the flag set,
// the environment, the help text, the README and the compose file can all be checked
// against the same list.
type setting struct {
	name  string
	env   []string // the first is the setting's own JETGRES_* variable; later ones are aliases
	usage string
	ptr   any // *string, *int, *float64, *time.Duration or *bool into a config
	def   any // of the type ptr points to
}

func (c *config) settings() []setting {
	return []setting{
		{"listen", envOf("listen"), "address for NATS clients (port 0 picks a free one)", &c.Listen, "0.0.0.0:4222"},
		{"http", envOf("http"), "address for /metrics, /healthz and /readyz (port 0 picks a free one)", &c.HTTP, "127.0.0.1:8080"},
		{"data-dir", envOf("data-dir"), "directory for local state; the private PostgreSQL cluster lives in <data-dir>/pg", &c.DataDir, "./jetgres-data"},
		{"database-url", append(envOf("database-url"), "DATABASE_URL"), "PostgreSQL URL or DSN; empty runs a private cluster in <data-dir>/pg", &c.DatabaseURL, ""},
		{"pg-start-failures", envOf("pg-start-failures"), "restarts of the private PostgreSQL that may fail in a row before jetgres gives up and exits (a restart that fails on a full disk does not count)", &c.PGFailedStarts, localpg.DefaultMaxFailedStarts},
		{"log-format", envOf("log-format"), "log format: text or json", &c.LogFormat, "text"},
		{"log-level", envOf("log-level"), "log level: debug, info, warn or error", &c.LogLevel, "info"},
		{"pool-size", envOf("pool-size"), "maximum PostgreSQL connections", &c.PoolSize, int(pg.MaxConnsDefault)},
		{"stmt-timeout", envOf("stmt-timeout"), "statement timeout for hot-path SQL", &c.StmtTimeout, pg.StmtTimeoutDefault},
		{"synchronous-commit", envOf("synchronous-commit"), "PostgreSQL synchronous_commit of publish and cursor transactions: on waits for the WAL flush before acknowledging; off acknowledges first, and a PostgreSQL or operating-system crash can lose the last 3 × wal_writer_delay (600 ms by default) of acknowledged publishes", &c.SyncCommit, "on"},
		{"append-limit-init", envOf("append-limit-init"), "initial Vegas limit of the append (publish) lane", &c.AppendLimitInit, flow.AppendInitDefault},
		{"append-limit-min", envOf("append-limit-min"), "minimum Vegas limit of the append lane", &c.AppendLimitMin, flow.AppendMinDefault},
		{"append-limit-max", envOf("append-limit-max"), "maximum Vegas limit of the append lane", &c.AppendLimitMax, flow.AppendMaxDefault},
		{"pop-limit-init", envOf("pop-limit-init"), "initial Vegas limit of the pop (read) lane", &c.PopLimitInit, flow.PopInitDefault},
		{"pop-limit-min", envOf("pop-limit-min"), "minimum Vegas limit of the pop lane", &c.PopLimitMin, flow.PopMinDefault},
		{"pop-limit-max", envOf("pop-limit-max"), "maximum Vegas limit of the pop lane", &c.PopLimitMax, flow.PopMaxDefault},
		{"ack-limit-init", envOf("ack-limit-init"), "initial Vegas limit of the ack (cursor write) lane", &c.AckLimitInit, flow.AckInitDefault},
		{"ack-limit-min", envOf("ack-limit-min"), "minimum Vegas limit of the ack lane", &c.AckLimitMin, flow.AckMinDefault},
		{"ack-limit-max", envOf("ack-limit-max"), "maximum Vegas limit of the ack lane", &c.AckLimitMax, flow.AckMaxDefault},
		{"append-vegas-alpha", envOf("append-vegas-alpha"), "Vegas alpha of the append lane: grow the limit while the estimated queue at PostgreSQL is at most this (kept small: publishes that wait fuse into the next transaction)", &c.AppendVegasAlpha, flow.AppendAlphaDefault},
		{"append-vegas-beta", envOf("append-vegas-beta"), "Vegas beta of the append lane: shrink the limit once the estimated queue is at least this", &c.AppendVegasBeta, flow.AppendBetaDefault},
		{"vegas-alpha", envOf("vegas-alpha"), "Vegas alpha of the pop and ack lanes: grow the limit while the estimated queue is at most this", &c.VegasAlpha, flow.AlphaDefault},
		{"vegas-beta", envOf("vegas-beta"), "Vegas beta of the pop and ack lanes: shrink the limit once the estimated queue is at least this", &c.VegasBeta, flow.BetaDefault},
		{"flush-overlap-after", envOf("flush-overlap-after"), "how long a publish transaction runs alone before the next may start beside it, within the append lane's limit; until then what arrives waits and fuses into the next (a hung transaction holds others up this long)", &c.FlushOverlap, bridge.FlushOverlapAfterDefault},
		{"tick-period", envOf("tick-period"), "how often streams with consumers are polled for commits made by other replicas (backs off while idle)", &c.TickPeriod, bridge.TickPeriodDefault},
		{"cursor-interval", envOf("cursor-interval"), "least time between two writes of a consumer's ack floor while plain acks move it (a double ack is written at once); after a crash, the acks since the last write are delivered again", &c.CursorInterval, bridge.CursorIntervalDefault},
		{"intake-bytes", envOf("intake-bytes"), "per-stream bound on publishes waiting for their transaction; beyond it publishes are rejected at once", &c.IntakeBytes, bridge.IntakeBytesDefault},
		{"intake-total-bytes", envOf("intake-total-bytes"), "bound on publishes waiting for their transaction over all streams together; beyond it publishes are rejected at once", &c.IntakeTotalBytes, bridge.IntakeTotalBytesDefault},
		{"tail-total-bytes", envOf("tail-total-bytes"), "bound on the tail caches of all streams together (each stream's own is 16 MiB); beyond it a growing cache evicts its oldest messages", &c.TailTotalBytes, bridge.TailTotalBytesDefault},
		{"subject-index-bytes", envOf("subject-index-bytes"), "bound on the in-memory index of the last sequence per subject (key-value keys among them) that gets are answered from; beyond it subjects are evicted and read back from PostgreSQL on their next get", &c.SubjectIndexBytes, bridge.SubjectIndexBytesDefault},
		{"replica-name", envOf("replica-name"), "this replica's name in consumer leases; stable across restarts, unique among replicas (empty: <host>:<NATS port>)", &c.ReplicaName, ""},
		{"ready-file", envOf("ready-file"), "once ready, write the bound NATS and HTTP addresses to this file as JSON", &c.ReadyFile, ""},
		{"ready-stall", envOf("ready-stall"), "/readyz answers 503 once the oldest publish transaction in flight has run this long (a commit hung on a lock or a saturated disk)", &c.ReadyStall, 10 * time.Second},
		{"shutdown-timeout", envOf("shutdown-timeout"), "how long a graceful shutdown may take before the rest is stopped hard", &c.ShutdownTimeout, 30 * time.Second},
		{"nats-config", envOf("nats-config"), "nats-server configuration file for client security and limits: users, bcrypt passwords, nkeys, per-user permissions, TLS (--listen, JetStream off and the bridge's leafnode listener win over it)", &c.NATSConfig, ""},
		{"user", envOf("user"), "user name NATS clients must log in with, with every permission (needs --password; added to --nats-config's users)", &c.User, ""},
		{"password", envOf("password"), "password for --user, plain or a bcrypt hash ($2a$...)", &c.Password, ""},
		{"tls-cert", envOf("tls-cert"), "PEM certificate (and chain) of the NATS listener; with --tls-key, clients must use TLS", &c.TLSCert, ""},
		{"tls-key", envOf("tls-key"), "PEM private key of --tls-cert", &c.TLSKey, ""},
		{"tls-ca", envOf("tls-ca"), "PEM certificate authorities that NATS client certificates must chain to (with --tls-verify; empty: the system's)", &c.TLSCA, ""},
		{"tls-verify", envOf("tls-verify"), "require every NATS client to present a valid certificate", &c.TLSVerify, false},
		{"cluster", envOf("cluster"), "host:port of the NATS cluster (route) listener that joins replicas' embedded servers into one cluster; empty: no cluster (route TLS and authorization through --nats-config)", &c.Cluster, ""},
		{"routes", envOf("routes"), "comma-separated route URLs of the other replicas (nats://host:port), as nats-server's --routes", &c.Routes, ""},
		{"cluster-name", envOf("cluster-name"), "name of the NATS cluster, the same on every replica; stream and consumer info report it", &c.ClusterName, "jetgres"},
		{"js-domain", envOf("js-domain"), "JetStream domain of jetgres, as nats-server's jetstream.domain: clients across leafnode remotes reach it as $JS.<domain>.API (empty: --nats-config's, else none); its own clients' API requests never leave it", &c.JSDomain, ""},
		{"lease", envOf("lease"), "how long a replica's ownership session may be silent before PostgreSQL frees its consumers for other replicas; a replica that cannot confirm its session stops delivering after a fifth of it; PostgreSQL ends a session whose network fell silent within it plus 3 s", &c.Lease, bridge.LeaseDefault},
	}
}

func envOf(name string) []string {
	return []string{"JETGRES_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

// newFlagSet registers every setting on a fresh flag set writing into c, with c's fields set
// to their defaults.
func newFlagSet(c *config, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("jetgres serve", flag.ContinueOnError)
	fs.SetOutput(output)
	for _, s := range c.settings() {
		switch p := s.ptr.(type) {
		case *string:
			fs.StringVar(p, s.name, s.def.(string), s.usage)
		case *int:
			fs.IntVar(p, s.name, s.def.(int), s.usage)
		case *float64:
			fs.Float64Var(p, s.name, s.def.(float64), s.usage)
		case *time.Duration:
			*p = s.def.(time.Duration)
			fs.Var((*durationValue)(p), s.name, s.usage)
		case *bool:
			fs.BoolVar(p, s.name, s.def.(bool), s.usage)
		default:
			panic(fmt.Sprintf("setting %s: unsupported type %T", s.name, s.ptr))
		}
	}
	fs.Usage = func() { printUsage(fs, c.settings()) }
	return fs
}

func printUsage(fs *flag.FlagSet, settings []setting) {
	w := fs.Output()
	fmt.Fprint(w, `Usage:
  jetgres [serve] [flags]   run the gateway (the default command)
  jetgres version           print version and build information

Flags of serve. Each is also read from its environment variable; a flag wins over the
environment, the environment over the default.

`)
	for _, s := range settings {
		f := fs.Lookup(s.name)
		fmt.Fprintf(w, "  --%-18s %s", s.name, strings.Join(s.env, ", "))
		if f.DefValue != "" {
			fmt.Fprintf(w, "  (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "\n        %s\n", s.usage)
	}
}

// durationValue is a flag.Value for a time.Duration whose parse error shows the syntax: the
// flag package's own says only "parse error".
type durationValue time.Duration

func (d *durationValue) String() string { return time.Duration(*d).String() }

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration: give a number with a unit, such as 500ms, 30s or 2m")
	}
	*d = durationValue(v)
	return nil
}

// parseConfig applies defaults, then the environment, then args. lookupEnv is os.LookupEnv
// outside tests. -h writes the usage to output and returns flag.ErrHelp; any other mistake
// is only returned, so that the caller can show it first rather than after the usage.
func parseConfig(args []string, lookupEnv func(string) (string, bool), output io.Writer) (config, error) {
	var c config
	fs := newFlagSet(&c, io.Discard)
	usage := fs.Usage
	fs.Usage = func() {}
	for _, s := range c.settings() {
		for _, name := range s.env {
			v, ok := lookupEnv(name)
			if !ok || v == "" {
				continue
			}
			if err := fs.Set(s.name, v); err != nil {
				// Only numbers, durations and booleans fail to parse, so the value is no secret.
				return config{}, fmt.Errorf("environment variable %s=%q: %w", name, v, err)
			}
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(output)
			usage()
		}
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	for _, a := range []struct{ name, addr string }{{"listen", c.Listen}, {"http", c.HTTP}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", a.name, err))
		}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("--log-format: %q is neither text nor json", c.LogFormat))
	}
	if _, err := c.logLevel(); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	if c.DataDir == "" && c.DatabaseURL == "" {
		errs = append(errs, errors.New("--data-dir: must not be empty when --database-url is empty"))
	}
	if c.PoolSize < 1 || c.PoolSize > math.MaxInt32 {
		errs = append(errs, fmt.Errorf("--pool-size: %d is not between 1 and %d", c.PoolSize, math.MaxInt32))
	}
	if c.StmtTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--stmt-timeout: %v is not positive", c.StmtTimeout))
	}
	if c.SyncCommit != "on" && c.SyncCommit != "off" {
		errs = append(errs, fmt.Errorf("--synchronous-commit: %q is neither on nor off", c.SyncCommit))
	}
	if c.FlushOverlap <= 0 {
		errs = append(errs, fmt.Errorf("--flush-overlap-after: %v is not positive", c.FlushOverlap))
	}
	if c.TickPeriod <= 0 {
		errs = append(errs, fmt.Errorf("--tick-period: %v is not positive", c.TickPeriod))
	}
	if c.CursorInterval <= 0 {
		errs = append(errs, fmt.Errorf("--cursor-interval: %v is not positive", c.CursorInterval))
	}
	if c.IntakeBytes < 1 {
		errs = append(errs, fmt.Errorf("--intake-bytes: %d is not positive", c.IntakeBytes))
	}
	if c.IntakeTotalBytes < 1 {
		errs = append(errs, fmt.Errorf("--intake-total-bytes: %d is not positive", c.IntakeTotalBytes))
	}
	if c.TailTotalBytes < 1 {
		errs = append(errs, fmt.Errorf("--tail-total-bytes: %d is not positive", c.TailTotalBytes))
	}
	if c.PGFailedStarts < 1 {
		errs = append(errs, fmt.Errorf("--pg-start-failures: %d is not positive", c.PGFailedStarts))
	}
	if c.SubjectIndexBytes < 1 {
		errs = append(errs, fmt.Errorf("--subject-index-bytes: %d is not positive", c.SubjectIndexBytes))
	}
	if c.ReadyStall <= 0 {
		errs = append(errs, fmt.Errorf("--ready-stall: %v is not positive", c.ReadyStall))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout: %v is not positive", c.ShutdownTimeout))
	}
	if c.Cluster != "" {
		if _, _, err := net.SplitHostPort(c.Cluster); err != nil {
			errs = append(errs, fmt.Errorf("--cluster: %w", err))
		}
	}
	if c.Routes != "" && c.Cluster == "" {
		errs = append(errs, errors.New("--routes: needs --cluster"))
	}
	if c.ClusterName == "" || strings.ContainsAny(c.ClusterName, " \t.*>") {
		errs = append(errs, fmt.Errorf("--cluster-name: %q is empty or holds a space, '.', '*' or '>'", c.ClusterName))
	}
	if c.Lease < time.Second {
		errs = append(errs, fmt.Errorf("--lease: %v is shorter than 1s", c.Lease))
	}
	if (c.User == "") != (c.Password == "") {
		errs = append(errs, errors.New("--user and --password: set both or neither"))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key: set both or neither"))
	}
	if c.TLSCert == "" && (c.TLSCA != "" || c.TLSVerify) {
		errs = append(errs, errors.New("--tls-ca and --tls-verify: need --tls-cert and --tls-key"))
	}
	// The lane limits themselves are checked by flow.NewLane, which names the field.
	return errors.Join(errs...)
}

func (c *config) logLevel() (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(c.LogLevel))
	return l, err
}

func (c *config) appendOptions() flow.Options {
	return flow.Options{Init: c.AppendLimitInit, Min: c.AppendLimitMin, Max: c.AppendLimitMax, Alpha: c.AppendVegasAlpha, Beta: c.AppendVegasBeta}
}

func (c *config) ackOptions() flow.Options {
	return flow.Options{Init: c.AckLimitInit, Min: c.AckLimitMin, Max: c.AckLimitMax, Alpha: c.VegasAlpha, Beta: c.VegasBeta}
}

func (c *config) popOptions() flow.Options {
	return flow.Options{Init: c.PopLimitInit, Min: c.PopLimitMin, Max: c.PopLimitMax, Alpha: c.VegasAlpha, Beta: c.VegasBeta}
}
