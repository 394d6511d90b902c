package pg

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

const (
	// MaxConnsDefault is the default pool size. A stock PostgreSQL allows max_connections=100
	// and keeps 3 of them for superusers; 40 lets two jetgres replicas share a stock server
	// (80 connections) and still leaves room for psql, pg_dump and monitoring. The pool is the
	// hard ceiling on concurrent work; the flow limiter normally binds well below it.
	MaxConnsDefault int32 = 40

	// StmtTimeoutDefault bounds one hot-path call (Append, ReadFiltered, WriteCursor, Ping) and
	// the wait for its connection.
	StmtTimeoutDefault = 30 * time.Second

	// BackgroundTimeoutDefault bounds one background call. Retention may drop large chunk
	// tables and admin calls may scan a stream, so it is longer than the hot-path timeout.
	BackgroundTimeoutDefault = 5 * time.Minute

	// ChunkDetachTimeoutDefault bounds how long detaching a chunk table may wait; see
	// Config.ChunkDetachTimeout.
	ChunkDetachTimeoutDefault = 2 * time.Second
)

// Config configures Open.
type Config struct {
	// URL is a PostgreSQL connection string, URL (postgres://…) or keyword/value form, as pgx
	// and libpq accept it. Required.
	URL string

	// MaxConns is the most connections the pool opens. It replaces a pool_max_conns given in
	// URL. Defaults to MaxConnsDefault.
	MaxConns int32

	// StmtTimeout bounds each hot-path call (Append, ReadFiltered, WriteCursor, Ping), and
	// separately its wait for a connection. Defaults to StmtTimeoutDefault.
	StmtTimeout time.Duration

	// BackgroundTimeout bounds each call of the other methods (administration, retention, point
	// reads, metrics), and separately its wait for a connection. Defaults to
	// BackgroundTimeoutDefault.
	BackgroundTimeout time.Duration

	// SynchronousCommit is PostgreSQL's synchronous_commit ("on" or "off") for the
	// transactions of the append path (Append) and the cursor path (WriteCursor), set per
	// transaction where the connection's own setting differs; every other statement keeps the
	// server's setting as it was when its connection opened. "off" acknowledges a
	// publish before its commit reaches the disk: a crash of PostgreSQL or of the operating
	// system can lose the commits of the last 3 × wal_writer_delay (600 ms by default), never
	// consistency. Empty leaves those transactions at the server's setting too.
	SynchronousCommit string

	// ChunkDetachTimeout bounds how long retention's detach of a chunk table from
	// jetgres.msgs waits for the transactions that began before it. While it waits it holds a
	// lock that the creation of a chunk (once per ChunkRowsFor messages of a stream) waits
	// for, so a detach gives up at this bound, and is not tried while a transaction that has
	// held jetgres.msgs for longer is open (a pg_dump, a long report): the chunk is dropped
	// on a later pass. Defaults to ChunkDetachTimeoutDefault.
	ChunkDetachTimeout time.Duration

	// Keepalive bounds how long PostgreSQL keeps the session of a pooled connection whose
	// network went silent (a partition, a machine gone): see keepaliveParams. A session
	// left open keeps its transaction's row locks, which another replica taking over the
	// consumers would wait for. Zero leaves PostgreSQL's settings, which leave it to the
	// operating system (two hours and more by default). A URL that sets one of the
	// parameters keeps its own.
	Keepalive time.Duration

	// Logger receives pg's records. Defaults to discarding them.
	Logger *slog.Logger
}

func (c *Config) applyDefaults() {
	if c.MaxConns == 0 {
		c.MaxConns = MaxConnsDefault
	}
	if c.StmtTimeout == 0 {
		c.StmtTimeout = StmtTimeoutDefault
	}
	if c.BackgroundTimeout == 0 {
		c.BackgroundTimeout = BackgroundTimeoutDefault
	}
	if c.ChunkDetachTimeout == 0 {
		c.ChunkDetachTimeout = ChunkDetachTimeoutDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	var errs []error
	if strings.TrimSpace(c.URL) == "" {
		errs = append(errs, errors.New("Config.URL is required"))
	}
	if c.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("Config.MaxConns must be at least 1, got %d", c.MaxConns))
	}
	if c.StmtTimeout < 0 {
		errs = append(errs, fmt.Errorf("Config.StmtTimeout must not be negative, got %s", c.StmtTimeout))
	}
	if c.BackgroundTimeout < 0 {
		errs = append(errs, fmt.Errorf("Config.BackgroundTimeout must not be negative, got %s", c.BackgroundTimeout))
	}
	if c.ChunkDetachTimeout < 0 {
		errs = append(errs, fmt.Errorf("Config.ChunkDetachTimeout must not be negative, got %s", c.ChunkDetachTimeout))
	}
	if c.Keepalive < 0 {
		errs = append(errs, fmt.Errorf("Config.Keepalive must not be negative, got %s", c.Keepalive))
	}
	switch c.SynchronousCommit {
	case "", "on", "off":
	default:
		errs = append(errs, fmt.Errorf(`Config.SynchronousCommit must be "on" or "off", got %q`, c.SynchronousCommit))
	}
	return errors.Join(errs...)
}

// keepaliveProbes is how many keepalive probes, a second apart, PostgreSQL sends a silent
// connection before it ends the session.
const keepaliveProbes = 3

// keepaliveParams are the server settings, sent with a connection's startup, that make
// PostgreSQL end a session whose network went silent within keepalive + keepaliveProbes
// seconds: keepalive probes once the connection has been idle for keepalive, and
// tcp_user_timeout for a connection that is not idle, whose last answer was never
// acknowledged (keepalives do not run then, and retransmissions go on for a quarter of an
// hour). Both act on PostgreSQL's socket: the client's side of a partition is bounded by
// the statement timeouts and, for the consumers, by the fence.
func keepaliveParams(keepalive time.Duration) map[string]string {
	return map[string]string{
		"tcp_keepalives_idle":     strconv.Itoa(max(int(keepalive/time.Second), 1)),
		"tcp_keepalives_interval": "1",
		"tcp_keepalives_count":    strconv.Itoa(keepaliveProbes),
		"tcp_user_timeout":        strconv.FormatInt((max(keepalive, time.Second) + keepaliveProbes*time.Second).Milliseconds(), 10),
	}
}

var keywordPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// Redact returns a connection string with any password replaced by "xxxxx", for logs and
// error messages.
func Redact(connString string) string {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		if err != nil {
			return "(unparsable connection URL)"
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	return keywordPassword.ReplaceAllString(connString, "${1}xxxxx")
}
