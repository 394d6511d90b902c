package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/consumer"
	"github.com/jetgres/jetgres/bridge/gets"
	"github.com/jetgres/jetgres/bridge/jsapi"
	"github.com/jetgres/jetgres/bridge/mirror"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/bridge/republish"
	"github.com/jetgres/jetgres/bridge/retention"
	"github.com/jetgres/jetgres/bridge/schedule"
	"github.com/jetgres/jetgres/bridge/sqlmove"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/wake"
	"github.com/jetgres/jetgres/pg"
)

const (
	// IntakeBytesDefault bounds each stream's fusion buffer: publishes waiting for the next
	// append transaction. A publish that does not fit is rejected at once. It is nats-server's
	// bound on a stream's ingest queue (128 MiB), which clients count on: nats.go's object
	// store publishes every chunk of an object before it waits for the first ack.
	IntakeBytesDefault = 128 << 20
	// IntakeTotalBytesDefault bounds the fusion buffers of all streams together, so that many
	// streams facing a slow database cannot each fill their own bound.
	IntakeTotalBytesDefault = 256 << 20
	// TailBytesDefault bounds each stream's tail cache: the newest committed messages, kept
	// so that consumers that keep up are served from memory and never touch PostgreSQL.
	TailBytesDefault = 16 << 20
	// SubjectIndexBytesDefault bounds the in-memory index of the last sequence per subject,
	// over all streams: enough for about a million keys of key-value buckets.
	SubjectIndexBytesDefault = 64 << 20
	// TailTotalBytesDefault bounds all tail caches together: every stream that takes
	// publishes has one, whether or not it has consumers yet.
	TailTotalBytesDefault = 256 << 20
	// FlushMaxMsgsDefault caps the messages of one stream that go into one transaction.
	FlushMaxMsgsDefault = 8192
	// FlushMaxStreamsDefault caps how many ready streams share one transaction. It is high:
	// with the append lane holding few transactions in flight, a permit that frees takes
	// whatever waits in every stream, and at 256 streams and 256 publishers a bundle held 20
	// to 50 streams; a cap of 16 would leave the rest for the next permit. What the bundle
	// carries stays bounded by the intakes' bytes.
	FlushMaxStreamsDefault = 1024
	// FlushOverlapAfterDefault is how long an append transaction runs alone before another may
	// start beside it; see Config.FlushOverlapAfter.
	FlushOverlapAfterDefault = 10 * time.Millisecond
	// APIQueueDefault bounds API requests waiting for a worker; beyond it the API answers
	// 503 at once.
	APIQueueDefault = 1024
	// APIWorkersDefault is how many API requests are served at once.
	APIWorkersDefault = 8
	// StreamSyncPeriodDefault is how often the stream list is re-read from PostgreSQL to
	// pick up streams that another replica created, changed or deleted.
	StreamSyncPeriodDefault = 5 * time.Second
	// MaxPayloadDefault is nats-server's own default max_payload.
	MaxPayloadDefault = 1 << 20

	// QueueGroup is the queue group of every replica's stream-subject and $JS.API
	// subscriptions: NATS hands each publish and each API request to one replica. The
	// bridges are leafnodes of their servers, which nats-server does not prefer over a
	// routed member: the pick is at random.
	QueueGroup = "jetgres"

	// tickPeriodMin is the shortest TickPeriod taken: every tick is a database statement.
	tickPeriodMin = time.Millisecond
)

// Config configures a Bridge. DB, Link, Append, Pop, Ack and ReplicaName are required. A zero
// value in any other field means its default; a negative one is refused.
type Config struct {
	DB   *pg.DB
	Link *leaf.Conn
	// CopyLink is a second link to the same server, through which streams with a mirror
	// or sources copy from their origins (bridge/mirror): the server never hands a link
	// what it sent itself, and a stream of this replica answers its API on Link. Nil
	// refuses mirrors and sources.
	CopyLink *leaf.Conn
	Append   *flow.Lane // appends
	Pop      *flow.Lane // reads behind the tail cache
	// Ack is the lane of consumer cursor writes. They are not pushes: a one-row update
	// takes a fraction of an append's round trip, and sharing the append lane's rtt_base
	// with them made every append read as congestion.
	Ack *flow.Lane
	// Logger receives the bridge's records. Defaults to discarding them.
	Logger *slog.Logger
	// Registerer receives the bridge's metrics. Nil registers nothing.
	Registerer prometheus.Registerer

	// IntakeBytes bounds each stream's fusion buffer. Defaults to IntakeBytesDefault.
	IntakeBytes int
	// IntakeTotalBytes bounds all fusion buffers together. Defaults to IntakeTotalBytesDefault.
	IntakeTotalBytes int
	// TailTotalBytes bounds all streams' tail caches together. Defaults to TailTotalBytesDefault.
	TailTotalBytes int
	// SubjectIndexBytes bounds the index of the last sequence per subject that gets are
	// answered from. Defaults to SubjectIndexBytesDefault.
	SubjectIndexBytes int
	// FlushMaxMsgs caps one stream's messages per transaction. Defaults to FlushMaxMsgsDefault.
	FlushMaxMsgs int
	// FlushMaxStreams caps the streams that share one transaction. Defaults to FlushMaxStreamsDefault.
	FlushMaxStreams int
	// FlushOverlapAfter is how long an append transaction runs alone before the next may start
	// beside it (within the append lane's limit). Until then what arrives waits for it and goes
	// into the next transaction together: a transaction costs about the same whether it
	// carries one message or eight, so two half-full ones in flight store less than one full
	// one. Past it the one in flight is either hung (a row lock another session holds) or
	// carrying a bundle big enough that overlapping the next pays. Defaults to
	// FlushOverlapAfterDefault.
	FlushOverlapAfter time.Duration
	// TickPeriod is how often the ticker polls the high-water marks of streams that have
	// consumers, to see commits made by other replicas. Defaults to TickPeriodDefault.
	TickPeriod time.Duration
	// CursorInterval is the least time between two writes of a consumer's ack floor while
	// plain acks move it; a double ack's write goes at once. Defaults to
	// CursorIntervalDefault.
	CursorInterval time.Duration
	// ReplicaName identifies this process as the owner of the consumers it serves, which
	// info reports and other replicas forward requests to, so it must be stable across
	// restarts and unique among replicas. Required: only the caller knows what tells its
	// replicas apart (jetgres serve names them <host>:<NATS port>).
	ReplicaName string
	// MaxPayload is the largest message the embedded server accepts; streams without a
	// max_msg_size report it. Defaults to 1 MiB.
	MaxPayload int32
	// Lease is how long PostgreSQL lets this replica's ownership session be silent before it
	// probes it and, once the probes fail, frees its consumers for other replicas. A replica
	// confirms its session ownership.ClaimsPerLease times per lease and stops serving every
	// consumer when it cannot, within a fifth of the lease, long before, all on Clock.
	// Defaults to LeaseDefault.
	Lease time.Duration
	// MaxMemory and MaxStore bound the bytes of memory and of file streams, as a JetStream
	// server's max_memory_store and max_file_store do: a stream whose max_bytes would take
	// the reservations of its storage past it is refused (10028, 10047), and once the bytes
	// stored pass it publishes are refused (10023). 0 is no bound.
	MaxMemory, MaxStore int64
	// ClusterName is the NATS cluster's name, reported with the serving replica in stream
	// and consumer info; empty reports no cluster.
	ClusterName string
	// Domain is the JetStream domain jetgres answers as, which PubAcks, stream info and
	// account info report, as nats-server's do; empty reports none.
	Domain string
	// Clock tells the bridge the time and wakes it when time has passed, for consumer
	// ownership too (see package clock). Nil means the system clock, the only right one
	// outside tests.
	Clock clock.Clock
}

// validate refuses a configuration that is missing what it needs or holds a negative or
// absurd value, naming every field at fault.
func (c *Config) validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("Config.DB is required"))
	}
	if c.Link == nil {
		errs = append(errs, errors.New("Config.Link is required"))
	}
	if c.Append == nil || c.Pop == nil || c.Ack == nil {
		errs = append(errs, errors.New("Config.Append, Config.Pop and Config.Ack are required"))
	}
	if c.ReplicaName == "" {
		errs = append(errs, errors.New("Config.ReplicaName is required"))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"IntakeBytes", int64(c.IntakeBytes)},
		{"IntakeTotalBytes", int64(c.IntakeTotalBytes)},
		{"TailTotalBytes", int64(c.TailTotalBytes)},
		{"SubjectIndexBytes", int64(c.SubjectIndexBytes)},
		{"FlushMaxMsgs", int64(c.FlushMaxMsgs)},
		{"FlushMaxStreams", int64(c.FlushMaxStreams)},
		{"FlushOverlapAfter", int64(c.FlushOverlapAfter)},
		{"MaxPayload", int64(c.MaxPayload)},
		{"CursorInterval", int64(c.CursorInterval)},
		{"Lease", int64(c.Lease)},
		{"MaxMemory", c.MaxMemory},
		{"MaxStore", c.MaxStore},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, got %d", "Config."+f.name, f.v))
		}
	}
	if c.TickPeriod < 0 || (c.TickPeriod > 0 && c.TickPeriod < tickPeriodMin) {
		errs = append(errs, fmt.Errorf("Config.TickPeriod must be 0 (the default) or at least %s, got %s", tickPeriodMin, c.TickPeriod))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	return nil
}

func (c *Config) applyDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.IntakeBytes == 0 {
		c.IntakeBytes = IntakeBytesDefault
	}
	if c.IntakeTotalBytes == 0 {
		c.IntakeTotalBytes = IntakeTotalBytesDefault
	}
	if c.TailTotalBytes == 0 {
		c.TailTotalBytes = TailTotalBytesDefault
	}
	if c.SubjectIndexBytes == 0 {
		c.SubjectIndexBytes = SubjectIndexBytesDefault
	}
	if c.FlushMaxMsgs == 0 {
		c.FlushMaxMsgs = FlushMaxMsgsDefault
	}
	if c.FlushMaxStreams == 0 {
		c.FlushMaxStreams = FlushMaxStreamsDefault
	}
	if c.FlushOverlapAfter == 0 {
		c.FlushOverlapAfter = FlushOverlapAfterDefault
	}
	if c.TickPeriod == 0 {
		c.TickPeriod = TickPeriodDefault
	}
	if c.CursorInterval == 0 {
		c.CursorInterval = CursorIntervalDefault
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = MaxPayloadDefault
	}
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
}

// Bridge serves JetStream on top of PostgreSQL through a leafnode link.
type Bridge struct {
	cfg  Config
	db   *pg.DB
	link *leaf.Conn
	log  *slog.Logger
	// clock is Config.Clock, or the system clock.
	clock clock.Clock

	// bg runs the background work: the stream sync loop. ctx is its
	// context, from Start until Stop cancels it; the SQL mover and retention run under it.
	bg  startstop.Group
	ctx context.Context

	// streams are the streams this process serves, their intakes and flushes.
	streams *stream.Registry
	// api serves the JetStream API, subscribed as apiSub.
	api    *jsapi.API
	apiSub *leaf.Subscription
	// fwd forwards consumer requests to the replica that serves the consumer, and takes
	// those forwarded here.
	fwd *ownership.Forwarder

	// metaKick wakes the stream sync loop when another replica changed a stream.
	metaKick chan struct{}
	// onMeta handles PostgreSQL's notifications of stream and consumer changes: metaChanged,
	// which a test replaces to lose every notification.
	onMeta func(streamID int64)

	cons      *consumer.Engine
	repub     *republish.Republisher
	gets      *gets.Indexes
	sql       *sqlmove.Mover[*stream.Stream]
	retention *retention.Enforcer[*stream.Stream]
	sched     *schedule.Scheduler[*stream.Stream]
	// copies copies into streams with a mirror or sources; nil without Config.CopyLink.
	copies *mirror.Engine

	stopOnce sync.Once
}

// New checks the configuration and builds a Bridge; Start makes it serve.
func New(cfg Config) (*Bridge, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	b := &Bridge{
		cfg:   cfg,
		db:    cfg.DB,
		link:  cfg.Link,
		log:   cfg.Logger,
		clock: clock.OrSystem(cfg.Clock),
	}
	b.metaKick = make(chan struct{}, 1)
	b.onMeta = b.metaChanged
	b.fwd = ownership.NewForwarder(ownership.ForwarderConfig{
		Store: cfg.DB, Link: cfg.Link, Clock: b.clock, Logger: cfg.Logger, Registerer: cfg.Registerer, ReplicaName: cfg.ReplicaName,
	})
	b.gets = gets.New(cfg.DB, cfg.SubjectIndexBytes, cfg.Registerer)
	ret, err := newRetention(b)
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	b.retention = ret
	b.streams = stream.NewRegistry(stream.Config{
		DB: cfg.DB, Link: cfg.Link, Append: cfg.Append, Clock: b.clock, Logger: cfg.Logger, Registerer: cfg.Registerer,
		QueueGroup:  QueueGroup,
		IntakeBytes: cfg.IntakeBytes, IntakeTotalBytes: cfg.IntakeTotalBytes,
		FlushMaxMsgs: cfg.FlushMaxMsgs, FlushMaxStreams: cfg.FlushMaxStreams, FlushOverlapAfter: cfg.FlushOverlapAfter,
		MaxMemory: cfg.MaxMemory, MaxStore: cfg.MaxStore,
		TailBytes: TailBytesDefault, Tails: tailcache.NewBudget(int64(cfg.TailTotalBytes)),
		Gets:       b.gets,
		NoInterest: b.retention.NoInterest,
		Domain:     cfg.Domain,
	})
	cons, err := newConsumers(b)
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	b.cons = cons
	b.repub = republish.New(republish.Config{Store: cfg.DB, Link: cfg.Link, Clock: b.clock, Logger: cfg.Logger, Registerer: cfg.Registerer,
		QueueGroup: QueueGroup, Local: b.streams.PublishLocal})
	b.streams.Subscribe(b.cons, b.repub)
	// After a promotion, what the new server lacks of the streams' changes may have been
	// missed as a lost notification may be: the streams are re-read, and the ownership loop
	// looks at its session at once, which was on the old server; the fence that its loss
	// sets off serves the consumers again from the positions the new server holds.
	cfg.DB.OnServerChange(func(ch pg.ServerChange) {
		b.streams.ServerChanged(ch)
		b.metaChanged(0)
	})
	sql, err := newSQLMover(b)
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	b.sql = sql
	if b.sched, err = newScheduler(b); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	if b.copies, err = newCopies(b); err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	var copies jsapi.Copies
	if b.copies != nil {
		copies = b.copies
	}
	b.api = jsapi.New(jsapi.Config{
		Link: cfg.Link, Store: cfg.DB, Streams: b.streams, Consumers: b.cons, Forwarder: b.fwd, Retention: b.retention,
		Clock: b.clock, Logger: cfg.Logger, Registerer: cfg.Registerer,
		Queue: APIQueueDefault, Workers: APIWorkersDefault,
		MaxPayload: cfg.MaxPayload, ClusterName: cfg.ClusterName, ReplicaName: cfg.ReplicaName,
		Domain: cfg.Domain, Copies: copies,
	})
	return b, nil
}

// Start loads the streams from PostgreSQL, subscribes their subjects and the JetStream API,
// and starts the background work. It returns once the bridge serves. ctx bounds the start
// only; cancelling it later stops nothing. A bridge starts once: a second Start fails, and so
// does a Start after Stop. A Start that fails stops whatever it had started, as Stop does, so
// that nothing keeps running; a Stop after it does nothing more.
func (b *Bridge) Start(ctx context.Context) (err error) {
	bctx, err := b.bg.Start(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("bridge: start: %w", err)
	}
	b.ctx = bctx
	defer func() {
		if err != nil {
			_ = b.Stop(ctx)
		}
	}()
	if err := b.repub.Start(b.ctx); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	// Stream subjects are subscribed from here on, and a failed start drains what their
	// publishes left in the ready queue: the dispatcher comes first.
	if err := b.streams.Start(ctx); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	if err := b.streams.Sync(ctx); err != nil {
		return fmt.Errorf("bridge: load streams: %w", err)
	}
	if err := b.api.Start(b.ctx); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	b.bg.Go(b.streamSyncLoop)
	b.bg.Go(func() { b.db.ListenMeta(b.ctx, b.onMeta) })
	if err := b.startConsumers(ctx); err != nil {
		return fmt.Errorf("bridge: start consumers: %w", err)
	}
	if err := b.retention.Start(b.ctx); err != nil {
		return fmt.Errorf("bridge: start retention: %w", err)
	}
	// The scheduler's locks are taken on the consumers' ownership session, open by now.
	if err := b.sched.Start(b.ctx); err != nil {
		return fmt.Errorf("bridge: start the scheduler: %w", err)
	}
	if err := b.sql.Start(b.ctx); err != nil {
		return fmt.Errorf("bridge: start the SQL mover: %w", err)
	}
	if b.copies != nil {
		if err := b.copies.Start(b.ctx); err != nil {
			return fmt.Errorf("bridge: start copying: %w", err)
		}
	}
	sub, err := b.link.Subscribe("$JS.API.>", QueueGroup, b.api.Serve)
	if err != nil {
		return fmt.Errorf("bridge: subscribe $JS.API.>: %w", err)
	}
	b.apiSub = sub
	// Serving means the server has our interest: a client that asks right after Start
	// returns must not get "no responders".
	if err := b.link.Flush(ctx); err != nil {
		return fmt.Errorf("bridge: flush link: %w", err)
	}
	return nil
}

// Stop stops taking new work, lets every flush in flight commit and answer its publishers,
// and stops the background work. ctx bounds the drain: once it ends, the flushes still in
// flight are cancelled (their publishers get an error or no answer). Either way every
// goroutine the bridge started has returned when Stop does. Stop is safe to call twice,
// before Start and after a failed Start.
func (b *Bridge) Stop(ctx context.Context) error {
	var err error
	b.stopOnce.Do(func() {
		if b.apiSub != nil {
			_ = b.apiSub.Unsubscribe()
		}
		b.streams.UnsubscribeAll()
		if b.copies != nil {
			b.copies.Stop()
		}
		// Everything already taken in still gets committed and answered.
		if e := b.streams.Stop(ctx); e != nil {
			err = fmt.Errorf("bridge: %w", e)
		}
		// What those flushes committed is republished before the link goes.
		b.repub.Stop(ctx)
		b.fwd.Stop()
		b.sched.Stop()
		b.cons.Stop(ctx)
		b.api.Stop()
		b.bg.Stop()
		b.sql.Stop()
		b.retention.Stop()
	})
	return err
}

// OldestFlush is how long the oldest append transaction still in flight has been running at
// now, a time of the bridge's clock, or 0 when none is. A commit that hangs (a row lock held
// elsewhere, a saturated disk) shows here while every publish it carries waits for its
// PubAck, so readiness can report the stall. Only served streams are looked at: a flush of
// a stream deleted meanwhile no longer counts.
func (b *Bridge) OldestFlush(now time.Time) time.Duration { return b.streams.OldestFlush(now) }

// startConsumers takes the requests other replicas forward here before the consumer
// engine serves any consumer (they forward its updates once its lock names this one), then
// starts the engine.
func (b *Bridge) startConsumers(ctx context.Context) error {
	if err := b.fwd.Start(ctx, b.api.Serve); err != nil {
		return err
	}
	return b.cons.Start(ctx, b.ctx)
}

// metaChanged is told of each stream and consumer change any replica commits (0: some may
// have been missed): the streams are re-read, and the ownership loop looks, at once.
func (b *Bridge) metaChanged(int64) {
	wake.Poke(b.metaKick)
	b.cons.Kick()
	if b.copies != nil {
		b.copies.Kick()
	}
}

// streamSyncLoop picks up stream changes that another replica made: at once when
// PostgreSQL notifies of them, and every StreamSyncPeriodDefault in case a notification was
// lost.
func (b *Bridge) streamSyncLoop() {
	t := b.clock.NewTicker(StreamSyncPeriodDefault)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C():
		case <-b.metaKick:
		}
		if err := b.streams.Sync(b.ctx); err != nil && b.ctx.Err() == nil {
			b.log.Warn("re-reading streams failed", "err", err)
		}
	}
}
