package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Sections of a run, in the order they run.
const (
	SectionPub      = "pub"
	SectionFetch    = "fetch"
	SectionPush     = "push"
	SectionLatency  = "latency"
	SectionOverload = "overload"
	// SectionSweep runs publishes over 1 to 256 streams against the naive bridge (sweep.go).
	SectionSweep = "sweep"
	// SectionNatsBench runs natscli's nats bench (natsbench.go).
	SectionNatsBench = "natsbench"
)

// Sections lists every section, in run order.
var Sections = []string{SectionPub, SectionFetch, SectionPush, SectionLatency, SectionOverload, SectionSweep, SectionNatsBench}

// Defaults of a full run. A quick run (Config.Quick) scales them down to a CI-sized smoke run.
const (
	// MsgsDefault is how many messages the async publish, fetch and push phases move.
	MsgsDefault = 200_000
	// SizeDefault is the payload size in bytes.
	SizeDefault = 128
	// DurationDefault bounds every timed phase: a phase ends when it has moved its messages
	// or when this much time has passed, whichever comes first.
	DurationDefault = 10 * time.Second
	// WindowDefault is how many async publishes may wait for their PubAck at once.
	WindowDefault = 1000
	// FetchBatchDefault is the pull batch of the fetch phase.
	FetchBatchDefault = 500
	// FixedConcurrency is the push and pop concurrency of the jetgres run whose Vegas
	// limiter is replaced by a fixed lane.
	FixedConcurrency = 160
	// PoolSize is the PostgreSQL pool of the jetgres nodes and of the naive baseline. It is
	// above FixedConcurrency so that the fixed lane, not the pool, is what binds.
	PoolSize = 200
	// MaxPublishers bounds the goroutines of one overload step.
	MaxPublishers = 1000
	// KVKeysDefault is how many keys the key-value watch of the push section reads.
	KVKeysDefault = 100_000
	// ObjectBytesDefault is the size of the object the push section gets.
	ObjectBytesDefault = 100 << 20
)

// Quick-run sizes: the whole run stays well under a minute on a small machine.
const (
	quickMsgs     = 20_000
	quickDuration = 2 * time.Second
	// quickNatsBenchMsgs is NatsBenchMsgs in a quick run.
	quickNatsBenchMsgs = 2_000
	quickKVKeys        = 2_000
	quickObjectBytes   = 4 << 20
)

// Config configures Run. The zero value of every field means its default.
type Config struct {
	// Msgs bounds the messages of the async publish, fetch and push phases. Defaults to
	// MsgsDefault, or 20,000 in a quick run.
	Msgs int
	// Size is the payload size in bytes, at least 8 (the send time is stamped in the first
	// eight). Defaults to SizeDefault.
	Size int
	// Duration bounds each timed phase. Defaults to DurationDefault, or 2 s in a quick run.
	Duration time.Duration
	// Window is the async publish window. Defaults to WindowDefault.
	Window int
	// NatsBenchMsgs is the message count of nats bench's throughput runs; its runs of one
	// operation at a time move a tenth of it. Defaults to NatsBenchMsgsDefault, or 2,000 in a
	// quick run.
	NatsBenchMsgs int
	// KVKeys is how many keys the push section's key-value bucket holds, each once, for
	// kv.WatchAll to read. Defaults to KVKeysDefault, or 2,000 in a quick run.
	KVKeys int
	// ObjectBytes is the size of the object the push section gets. Defaults to
	// ObjectBytesDefault, or 4 MiB in a quick run.
	ObjectBytes int
	// SynchronousCommit is the --synchronous-commit of the in-process jetgres ("on" or
	// "off"), or the one the jetgres given by URL runs with. Defaults to "on". The nats bench
	// section measures jetgres in both modes whatever it is.
	SynchronousCommit string
	// Quick shrinks everything to a smoke run that checks the machinery, not the numbers.
	Quick bool
	// Only lists the sections to run. Defaults to all of Sections.
	Only []string
	// DatabaseURL names a running PostgreSQL to use instead of a private cluster. It must be
	// a Unix socket or a loopback address. Defaults to a private cluster in a temporary
	// directory, with fsync and synchronous_commit on.
	DatabaseURL string
	// URL names a running jetgres (nats://host:port on loopback) to measure instead of
	// starting one in-process; the fixed-concurrency overload run needs an in-process node
	// and is skipped. Defaults to starting jetgres in-process.
	URL string
	// Command is the command line recorded in the report.
	Command string
	// Progress receives a progress line while the run goes on; redrawn in place when
	// ProgressTTY is set, one line per phase otherwise. Nil shows nothing.
	Progress    io.Writer
	ProgressTTY bool
	// Logger receives the components' logs. Defaults to discarding them.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Msgs == 0 {
		c.Msgs = MsgsDefault
		if c.Quick {
			c.Msgs = quickMsgs
		}
	}
	if c.Size == 0 {
		c.Size = SizeDefault
	}
	if c.Duration == 0 {
		c.Duration = DurationDefault
		if c.Quick {
			c.Duration = quickDuration
		}
	}
	if c.Window == 0 {
		c.Window = WindowDefault
	}
	if c.NatsBenchMsgs == 0 {
		c.NatsBenchMsgs = NatsBenchMsgsDefault
		if c.Quick {
			c.NatsBenchMsgs = quickNatsBenchMsgs
		}
	}
	if c.KVKeys == 0 {
		c.KVKeys = KVKeysDefault
		if c.Quick {
			c.KVKeys = quickKVKeys
		}
	}
	if c.ObjectBytes == 0 {
		c.ObjectBytes = ObjectBytesDefault
		if c.Quick {
			c.ObjectBytes = quickObjectBytes
		}
	}
	if c.SynchronousCommit == "" {
		c.SynchronousCommit = "on"
	}
	if len(c.Only) == 0 {
		c.Only = Sections
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if c.Msgs < 1 {
		errs = append(errs, fmt.Errorf("Config.Msgs is %d, must be at least 1", c.Msgs))
	}
	if c.Size < 8 || c.Size > 1<<20 {
		errs = append(errs, fmt.Errorf("Config.Size is %d, must be within [8, 1048576]", c.Size))
	}
	if c.Duration < 100*time.Millisecond || c.Duration > 10*time.Minute {
		errs = append(errs, fmt.Errorf("Config.Duration is %s, must be within [100ms, 10m]", c.Duration))
	}
	if c.Window < 1 || c.Window > 100_000 {
		errs = append(errs, fmt.Errorf("Config.Window is %d, must be within [1, 100000]", c.Window))
	}
	if c.NatsBenchMsgs < 1 {
		errs = append(errs, fmt.Errorf("Config.NatsBenchMsgs is %d, must be at least 1", c.NatsBenchMsgs))
	}
	if c.KVKeys < 1 {
		errs = append(errs, fmt.Errorf("Config.KVKeys is %d, must be at least 1", c.KVKeys))
	}
	if c.ObjectBytes < 1 || c.ObjectBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("Config.ObjectBytes is %d, must be within [1, 1073741824]", c.ObjectBytes))
	}
	if c.SynchronousCommit != "on" && c.SynchronousCommit != "off" {
		errs = append(errs, fmt.Errorf("Config.SynchronousCommit is %q, must be on or off", c.SynchronousCommit))
	}
	for _, s := range c.Only {
		if !slices.Contains(Sections, s) {
			errs = append(errs, fmt.Errorf("Config.Only: unknown section %q (want %s)", s, strings.Join(Sections, ", ")))
		}
	}
	if c.URL != "" {
		if err := checkLoopbackURL(c.URL); err != nil {
			errs = append(errs, fmt.Errorf("Config.URL: %w", err))
		}
	}
	if c.DatabaseURL != "" {
		if err := checkLoopbackDSN(c.DatabaseURL); err != nil {
			errs = append(errs, fmt.Errorf("Config.DatabaseURL: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (c *Config) runs(section string) bool { return slices.Contains(c.Only, section) }

// checkLoopbackURL accepts nats://host:port URLs whose host is a loopback address.
func checkLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "nats" {
		return fmt.Errorf("%q: want a nats://host:port URL", raw)
	}
	return checkLoopbackHost(u.Hostname())
}

// checkLoopbackDSN accepts PostgreSQL URLs and keyword/value strings whose hosts are Unix
// socket directories or loopback addresses.
func checkLoopbackDSN(dsn string) error {
	var hosts []string
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return errors.New("not a valid PostgreSQL URL")
		}
		hosts = strings.Split(u.Host, ",")
		if h := u.Query().Get("host"); h != "" {
			hosts = strings.Split(h, ",")
		}
	} else {
		for _, kv := range strings.Fields(dsn) {
			if v, ok := strings.CutPrefix(kv, "host="); ok {
				hosts = strings.Split(v, ",")
			}
		}
	}
	for _, h := range hosts {
		if h == "" || strings.HasPrefix(h, "/") {
			continue // the default or a Unix socket directory
		}
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		if err := checkLoopbackHost(strings.Trim(h, "[]")); err != nil {
			return err
		}
	}
	return nil
}

func checkLoopbackHost(host string) error {
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("host %q is not a loopback address: the bench only loads this machine", host)
	}
	return nil
}
