package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/consumer/cursor"
	"github.com/jetgres/jetgres/bridge/consumer/metrics"
	"github.com/jetgres/jetgres/bridge/consumer/nextsub"
	"github.com/jetgres/jetgres/bridge/consumer/pending"
	"github.com/jetgres/jetgres/bridge/consumer/purgemove"
	"github.com/jetgres/jetgres/bridge/consumer/sharedread"
	"github.com/jetgres/jetgres/bridge/consumer/startpos"
	"github.com/jetgres/jetgres/bridge/consumer/ticker"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/bridge/retention"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// TickPeriodDefault is the ticker's polling period while consumers wait; see
	// ticker.PeriodDefault.
	TickPeriodDefault = ticker.PeriodDefault
	// TickIdleMaxDefault is how far the ticker backs off while the high-water marks it
	// polls do not move.
	TickIdleMaxDefault = ticker.IdleMaxDefault

	// consumerQueueMax bounds the pull requests and acks waiting for one consumer's
	// goroutine; beyond it pull requests get 409 and acks are dropped (and redelivered).
	consumerQueueMax = 1 << 16
	// activationsMax bounds the consumers being loaded from PostgreSQL at once because a
	// request named one this process does not serve yet.
	activationsMax = 16
)

// Store is what the engine and its subpackages ask of PostgreSQL; *pg.DB satisfies it.
type Store interface {
	cursor.CursorStore
	startpos.PositionStore
	purgemove.PurgeStore
	ticker.TickStore
	CreateConsumer(ctx context.Context, c pg.Consumer, maxConsumers int) (pg.Consumer, error)
	UpdateConsumerConfig(ctx context.Context, streamID int64, name string, config []byte) error
	DeleteConsumer(ctx context.Context, streamID int64, name string) error
	GetConsumer(ctx context.Context, streamID int64, name string) (pg.Consumer, error)
	SQLConsumerState(ctx context.Context, id int64) (pg.SQLConsumerState, bool, error)
	ReadFiltered(ctx context.Context, p pg.ReadParams, filters []string) (out []pg.Message, through uint64, rtt time.Duration, err error)
	CountPending(ctx context.Context, p pg.PendingParams) (uint64, error)
	GoneSeqs(ctx context.Context, id int64, seqs []uint64) ([]uint64, error)
	OpenOwnership(ctx context.Context, clk clock.Clock, keepalive, timeout time.Duration) (*pg.Ownership, error)
	SetOwner(ctx context.Context, id int64, owner string) (pg.Consumer, string, error)
	ClearOwner(ctx context.Context, owner string) error
}

// Link is what the engine asks of its link to the NATS server; *leaf.Conn satisfies it.
// Handlers run on the link's read loop; SubscribeBorrowed's lend the message only for the
// call.
type Link interface {
	Publish(subject, reply string, hdr, data []byte) error
	PublishQueue(subject string, reply []byte, queue string, hdr, data []byte) error
	Subscribe(subject, queue string, h leaf.Handler) (*leaf.Subscription, error)
	SubscribeBorrowed(subject, queue string, h leaf.Handler) (*leaf.Subscription, error)
	// HasInterest and HasQueueInterest report whether the server announced a subscriber
	// (in the group) for subject; InterestVersion moves and InterestChanged signals when
	// what it announced changes.
	HasInterest(subject string) bool
	HasQueueInterest(subject, group string) bool
	InterestVersion() uint64
	InterestChanged() <-chan struct{}
}

var _ Link = (*leaf.Conn)(nil)

// Retention is what the engine tells the retention engine (bridge/retention): every ack
// that reaches this replica, and the consumers it creates, changes and deletes.
type Retention interface {
	NoteAck(s *stream.Stream, consumer string, sseq uint64, body []byte)
	Stale(s *stream.Stream)
	ConsumerDeleted(ctx context.Context, s *stream.Stream)
}

// Config configures an Engine. Every field is required but Logger and Registerer; the
// durations must be positive.
type Config struct {
	Store Store
	Link  Link
	// Pop is the lane of reads behind the tail cache, and Ack that of cursor writes.
	Pop, Ack *flow.Lane
	Clock    clock.Clock
	// Logger receives the engine's records. Defaults to discarding them.
	Logger *slog.Logger
	// Registerer receives the engine's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// Streams are the streams whose consumers the engine serves. The engine does not
	// subscribe itself to their events: whoever builds it does (it is a stream.Subscriber).
	Streams   *stream.Registry
	Retention Retention

	// TickPeriod is how often the ticker polls the high-water marks of streams that have
	// consumers, to see commits made by other replicas.
	TickPeriod time.Duration
	// CursorInterval is the least time between two writes of a consumer's ack floor while
	// plain acks move it.
	CursorInterval time.Duration
	// Lease is how long PostgreSQL lets the ownership session be silent before it frees
	// this replica's consumers.
	Lease time.Duration
	// ReplicaName names this replica as the owner of the consumers it serves.
	ReplicaName string
	// ClusterName is the NATS cluster's name, reported in consumer info; empty reports no
	// cluster.
	ClusterName string
	// TailBytes is the bound of each stream's tail cache: a tick reads at most half of it
	// into the tail.
	TailBytes int
}

func (c *Config) validate() error {
	var errs []error
	if c.Store == nil || c.Link == nil || c.Pop == nil || c.Ack == nil || c.Clock == nil || c.Streams == nil || c.Retention == nil {
		errs = append(errs, errors.New("Config.Store, Link, Pop, Ack, Clock, Streams and Retention are required"))
	}
	if c.ReplicaName == "" {
		errs = append(errs, errors.New("Config.ReplicaName is required"))
	}
	if c.TickPeriod <= 0 || c.CursorInterval <= 0 || c.Lease <= 0 || c.TailBytes <= 0 {
		errs = append(errs, fmt.Errorf("Config.TickPeriod, CursorInterval, Lease and TailBytes must be positive, got %s, %s, %s and %d",
			c.TickPeriod, c.CursorInterval, c.Lease, c.TailBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return nil
}

// Engine serves the pull and push consumers this replica owns: the ack subscription, the
// ticker, the ownership loop, and every consumer's goroutine.
type Engine struct {
	cfg   Config
	db    Store
	link  Link
	clock clock.Clock
	log   *slog.Logger
	owner string
	m     *metrics.Instruments
	// cursors is what every consumer's cursor writer shares.
	cursors cursor.WriterConfig
	// The warnings of attempts that fail together while the database is away, thinned.
	// Each warning has a throttle of its own, so that one cannot hide another.
	warnRead, warnPending warnlog.Throttle
	ticker                *ticker.Poller

	// g runs the ticker, the lease keeper, every consumer's goroutine and their background
	// reads and cursor writes; ctx is its context, nil until Start.
	g       startstop.Group
	ctx     context.Context
	ackSub  *leaf.Subscription
	activeN chan struct{} // activation slots

	mu      sync.RWMutex
	streams map[*stream.Stream]*streamConsumers

	// keeper holds the locks of the consumers this replica serves, and held their MSG.NEXT
	// subscriptions; see replicas.go.
	keeper *ownership.Keeper
	held   *nextsub.Held[*consumer]

	// fcSub takes the answers to push consumers' flow-control requests.
	fcSub *leaf.Subscription
	// pushMu guards pushers, the push consumers the interest watcher looks after.
	pushMu  sync.Mutex
	pushers map[*consumer]struct{}
}

// streamConsumers is one stream's consumers.
type streamConsumers struct {
	s     *stream.Stream
	reads sharedread.Reads

	mu   sync.RWMutex
	cons map[string]*consumer
}

func (sc *streamConsumers) list() []*consumer {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return slices.Collect(maps.Values(sc.cons))
}

func (sc *streamConsumers) get(name string) *consumer {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return sc.cons[name]
}

// registry returns the stream's consumer registry, nil when it has none yet.
func (cs *Engine) registry(s *stream.Stream) *streamConsumers {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	return cs.streams[s]
}

// New checks the configuration and builds an Engine; Start makes it serve.
func New(cfg Config) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cs := &Engine{
		cfg:     cfg,
		db:      cfg.Store,
		link:    cfg.Link,
		clock:   cfg.Clock,
		log:     log,
		owner:   cfg.ReplicaName,
		activeN: make(chan struct{}, activationsMax),
		streams: make(map[*stream.Stream]*streamConsumers),
	}
	cs.m = metrics.New(cfg.Registerer, cs.gauges)
	cs.cursors = cursor.WriterConfig{Store: cfg.Store, Lane: cfg.Ack, Clock: cfg.Clock, Interval: cfg.CursorInterval, Logger: log,
		Go: cs.g.Go, Writes: cs.m.CursorWrites, Latency: cs.m.CursorLatency}
	cs.held = nextsub.New[*consumer](cfg.Registerer)
	cs.ticker = ticker.New(ticker.PollerConfig{Store: cfg.Store, Read: cs.ReadPop, Clock: cfg.Clock, Logger: log, Period: cfg.TickPeriod,
		TailBytes: cfg.TailBytes, Streams: cs.ticked, Ticks: cs.m.Ticks, Reads: cs.m.TickReads})
	keeper, err := ownership.New(ownership.Config{
		Store: cfg.Store, Clock: cfg.Clock, Logger: log, Registerer: cfg.Registerer, Lease: cfg.Lease,
		Streams:     cfg.Streams.List,
		Serve:       cs.serveClaimed,
		StopDeleted: cs.stopDeleted,
		StopAll:     cs.stopAll,
		Go:          cs.g.Go,
	})
	if err != nil {
		return nil, err
	}
	cs.keeper = keeper
	return cs, nil
}

// Start takes the locks of the stored consumers nobody serves, as many as are this
// replica's share, and serves them; then it subscribes the ack and flow-control subjects
// and starts the ticker, the interest watcher and the ownership loop, all under parent,
// which Stop cancels. ctx bounds the start only. A start that failed part-way is undone by
// Stop.
func (cs *Engine) Start(ctx, parent context.Context) error {
	cctx, err := cs.g.Start(parent)
	if err != nil {
		return err
	}
	cs.ctx = cctx
	if err := cs.keeper.Open(ctx); err != nil {
		return err
	}
	if serve := cs.keeper.ClaimFree(ctx); serve != nil {
		serve(ctx)
	}
	sub, err := cs.link.SubscribeBorrowed(jswire.AckPrefix+">", "", cs.onAck)
	if err != nil {
		return err
	}
	cs.ackSub = sub
	if cs.fcSub, err = cs.link.SubscribeBorrowed(jswire.FCPrefix+">", "", cs.onFlowControl); err != nil {
		return err
	}
	cs.g.Go(cs.interestLoop)
	cs.g.Go(func() { cs.ticker.Run(cs.ctx) })
	run := cs.keeper.Run()
	cs.g.Go(func() { run(cs.ctx) })
	return nil
}

// Stop stops every consumer goroutine, lets the cursor writes in flight finish, writes
// every floor not yet persisted and gives the locks back. ctx bounds the wait. Stop is
// safe to call before Start and after a failed Start.
func (cs *Engine) Stop(ctx context.Context) {
	if cs.ctx == nil {
		cs.g.Stop() // never started, and now never will
		return
	}
	if cs.ackSub != nil {
		_ = cs.ackSub.Unsubscribe()
	}
	if cs.fcSub != nil {
		_ = cs.fcSub.Unsubscribe()
	}
	var all []*consumer
	cs.mu.Lock()
	for _, sc := range cs.streams {
		all = append(all, sc.list()...)
	}
	cs.mu.Unlock()
	for _, c := range all {
		c.stop(stopShutdown)
	}
	for _, c := range all {
		select {
		case <-c.done:
		case <-ctx.Done():
		}
	}
	for _, c := range all {
		c.cw.Flush(ctx)
	}
	cs.g.Stop()
	if err := cs.db.ClearOwner(context.WithoutCancel(ctx), cs.owner); err != nil {
		cs.log.Warn("clearing this replica from its consumers failed", "err", err)
	}
	cs.keeper.Close()
}

// Wait waits until every goroutine the engine started has returned, or ctx ends.
func (cs *Engine) Wait(ctx context.Context) error { return cs.g.Wait(ctx) }

// Kick makes the ownership loop look at once: a consumer may have changed elsewhere.
func (cs *Engine) Kick() { cs.keeper.Kick() }

// OnCommitted wakes the consumers waiting for rows that s's tail just took: the
// local-commit fast path, no tick needed.
func (cs *Engine) OnCommitted(s *stream.Stream, ev stream.Committed) {
	if len(ev.Stored) == 0 {
		return
	}
	sc := cs.registry(s)
	if sc == nil {
		return
	}
	for _, c := range sc.list() {
		c.committed(ev.Stored, ev.From)
	}
}

// OnDropped stops serving a deleted stream's consumers; PostgreSQL removed their rows with
// the stream.
func (cs *Engine) OnDropped(s *stream.Stream, _ stream.Dropped) {
	cs.mu.Lock()
	sc := cs.streams[s]
	delete(cs.streams, s)
	cs.mu.Unlock()
	if sc == nil {
		return
	}
	for _, c := range sc.list() {
		c.stop(stopDeleted)
	}
}

// OnPurged makes the consumers forget rows they read or counted that may be gone, and
// moves them as a purge request moves them (see purgeMoves).
func (cs *Engine) OnPurged(ctx context.Context, s *stream.Stream, ev stream.Purged) {
	if ev.Consumed {
		return
	}
	sc := cs.registry(s)
	if sc == nil {
		return
	}
	sc.reads.Forget()
	for _, c := range sc.list() {
		c.markStale(pending.AllRows)
		c.postControl(event{kind: evPurged})
	}
	if ev.Request {
		cs.purgeMoves(ctx, sc, ev.Subject)
	}
}

// purgeMoves moves the consumers that nats-server moves after a purge request (see
// bridge/consumer/purgemove).
func (cs *Engine) purgeMoves(ctx context.Context, sc *streamConsumers, subject string) {
	s := sc.s
	plan, err := purgemove.NewPlan(ctx, cs.db, s.ID(), subject)
	if err != nil {
		cs.log.Warn("moving consumers after a purge", "stream", s.Name(), "err", err)
		return
	}
	for _, c := range sc.list() {
		move, ok := plan.For(c.filters())
		if !ok {
			continue
		}
		if move.Wider {
			if move.Gone, err = cs.goneOf(ctx, s, c); err != nil {
				cs.log.Warn("pending messages after a purge", "stream", s.Name(), "consumer", c.name, "err", err)
				continue
			}
		}
		c.postControl(event{kind: evPurged, purge: move})
	}
}

// goneOf finds which of a consumer's pending deliveries no longer exist. Deliveries made
// after the purge are of messages it left, so a snapshot taken now is enough.
func (cs *Engine) goneOf(ctx context.Context, s *stream.Stream, c *consumer) (map[uint64]bool, error) {
	c.mu.Lock()
	pending := c.st.PendingSeqs()
	c.mu.Unlock()
	if len(pending) == 0 {
		return nil, nil
	}
	gone, err := cs.db.GoneSeqs(ctx, s.ID(), pending)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]bool, len(gone))
	for _, seq := range gone {
		out[seq] = true
	}
	return out, nil
}

// OnRemoved tells the consumers that rows they may have counted as pending went.
func (cs *Engine) OnRemoved(s *stream.Stream, ev stream.Removed) {
	if ev.Unread == 0 {
		return
	}
	if sc := cs.registry(s); sc != nil {
		for _, c := range sc.list() {
			c.markStale(ev.Unread)
		}
	}
}

// HandlePull takes a pull request that reached this replica through the $JS.API
// queue group. The replica serving the consumer has its own subscription to the consumer's
// subject and so has the request already, whether it is this one or another: only a request
// for a consumer served nowhere is taken here, by taking the consumer over.
func (cs *Engine) HandlePull(m *leaf.Msg, streamName, consumerName string) {
	if cs.held.Holds(nextsub.Ref{Stream: streamName, Consumer: consumerName}) || cs.link.HasQueueInterest(m.Subject, "") {
		return
	}
	cs.servePull(m, streamName, consumerName)
}

// servePull runs on the link's read loop: it only hands the request to the consumer's
// goroutine, in arrival order with that consumer's acks.
func (cs *Engine) servePull(m *leaf.Msg, streamName, consumerName string) {
	if m.Reply == "" {
		return
	}
	ev := event{kind: evPull, reply: m.Reply, data: m.Data}
	if c := cs.find(streamName, consumerName); c != nil {
		if !c.post(ev) {
			_ = cs.link.Publish(m.Reply, "", jswire.StatusHeader(409, jswire.DescMaxWaiting), nil)
		}
		return
	}
	cs.activateLater(streamName, consumerName, ev)
}

// find returns the consumer if this process serves it.
func (cs *Engine) find(streamName, consumerName string) *consumer {
	s := cs.cfg.Streams.Lookup(streamName)
	if s == nil {
		return nil
	}
	return cs.served(s, consumerName)
}

// served returns s's consumer of that name if this process serves it.
func (cs *Engine) served(s *stream.Stream, consumerName string) *consumer {
	sc := cs.registry(s)
	if sc == nil {
		return nil
	}
	return sc.get(consumerName)
}

// registryFor returns the stream's consumer registry, creating it.
func (cs *Engine) registryFor(s *stream.Stream) *streamConsumers {
	sc := cs.registry(s)
	if sc != nil {
		return sc
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if sc = cs.streams[s]; sc == nil {
		sc = &streamConsumers{s: s, cons: make(map[string]*consumer)}
		cs.streams[s] = sc
	}
	return sc
}

// streamLoaded returns the stream's registry, starting its tail at the high-water mark
// PostgreSQL gives if no commit of this process started it.
func (cs *Engine) streamLoaded(ctx context.Context, s *stream.Stream) (*streamConsumers, error) {
	sc := cs.registry(s)
	if sc != nil {
		return sc, nil
	}
	if !s.Tail().Started() {
		hw, err := cs.db.HighWater(ctx, []int64{s.ID()})
		if err != nil {
			return nil, err
		}
		s.Tail().StartAfter(hw[s.ID()])
		s.Tail().Raise(hw[s.ID()])
	}
	return cs.registryFor(s), nil
}

// activate starts serving a stored consumer whose lease this process holds. start, for a
// consumer just created, carries the start position decided at creation.
func (cs *Engine) activate(ctx context.Context, sc *streamConsumers, row pg.Consumer, start *startpos.Position) (*consumer, error) {
	var cfg server.ConsumerConfig
	if err := json.Unmarshal(row.Config, &cfg); err != nil {
		return nil, errors.New("stored consumer config does not decode: " + err.Error())
	}
	c := newConsumer(cs, sc, row, cfg, start)
	// The tail knows of this process's commits only until a tick: other replicas' may lie
	// beyond it.
	hw, err := cs.highWater(ctx, sc.s)
	if err != nil {
		cs.release(row.ID)
		return nil, err
	}
	sc.s.Tail().Raise(hw)
	c.readFirst(c.ctx)
	from, extra := c.countFrom()
	npc, err := cs.db.CountPending(ctx, pg.PendingParams{StreamID: sc.s.ID(), From: from, UpTo: hw, Filters: c.filters()})
	if err != nil {
		cs.release(row.ID)
		return nil, err
	}
	c.npc = int64(npc + extra)
	c.pend.Begin(c.st.Next(), hw) // no commit reaches c before it is registered below
	if start != nil {
		// A new consumer: its create response reports it as it is now, before its goroutine
		// runs, with nothing delivered and every matching message pending.
		c.mu.Lock()
		c.initial, _, _ = cs.infoLocked(c)
		c.mu.Unlock()
		c.initial.NumPending = uint64(c.npc)
		c.initial.PushBound = cs.pushBound(c.initial.Config)
	}
	sc.mu.Lock()
	if old := sc.cons[c.name]; old != nil {
		sc.mu.Unlock()
		cs.release(row.ID) // the lock counted twice
		return old, nil
	}
	sc.cons[c.name] = c
	sc.mu.Unlock()
	if _, push := c.out.(*pusher); push {
		cs.trackPush(c, true)
	}
	cs.hold(c)
	if !cs.g.Go(c.run) {
		cs.remove(c)
		close(c.done) // for a stop that listed it meanwhile
		return nil, errStopping
	}
	return c, nil
}

// release gives back one count of a consumer's lock that no served consumer stands for.
func (cs *Engine) release(id int64) {
	cs.keeper.Release(id)
}

// remove forgets a consumer that stopped.
func (cs *Engine) remove(c *consumer) {
	c.sc.mu.Lock()
	if c.sc.cons[c.name] == c {
		delete(c.sc.cons, c.name)
	}
	c.sc.mu.Unlock()
	cs.trackPush(c, false)
	cs.unhold(c)
}

// descReadInSQL answers a pull of a consumer read in SQL (jetgres.read_in_sql): a 409, which
// clients end the pull on, as for a deleted consumer, with the reason.
const descReadInSQL = "Consumer Is Read In SQL"

// activateLater loads a consumer that a request named but this process does not serve yet,
// off the read loop, and hands it the request. Another replica may have created it, or it
// may be this process's own consumer whose lease had not expired at start.
func (cs *Engine) activateLater(streamName, consumerName string, ev event) {
	select {
	case cs.activeN <- struct{}{}:
	default:
		_ = cs.link.Publish(ev.reply, "", jswire.StatusHeader(jserr.NoResponders.Code, jserr.NoResponders.Description), nil)
		return
	}
	if !cs.g.Go(func() {
		defer func() { <-cs.activeN }()
		c, err := cs.ensure(cs.ctx, streamName, consumerName)
		switch {
		case errors.Is(err, pg.ErrReadInSQL):
			_ = cs.link.Publish(ev.reply, "", jswire.StatusHeader(409, descReadInSQL), nil)
		case errors.Is(err, pg.ErrServedElsewhere):
			// Another replica serves it and received the same request.
		case err != nil:
			_ = cs.link.Publish(ev.reply, "", jswire.StatusHeader(jserr.NoResponders.Code, jserr.NoResponders.Description), nil)
		case !c.post(ev):
			_ = cs.link.Publish(ev.reply, "", jswire.StatusHeader(409, jswire.DescMaxWaiting), nil)
		}
	}) {
		<-cs.activeN
		_ = cs.link.Publish(ev.reply, "", jswire.StatusHeader(jserr.NoResponders.Code, jserr.NoResponders.Description), nil)
	}
}

// ensure returns the consumer, loading it from PostgreSQL if its lease can be taken.
func (cs *Engine) ensure(ctx context.Context, streamName, consumerName string) (*consumer, error) {
	if c := cs.find(streamName, consumerName); c != nil {
		return c, nil
	}
	// Names come from subject tokens, which can be any bytes; no consumer has an invalid
	// name, and PostgreSQL would refuse to look one up.
	if !jswire.ValidName(consumerName) {
		return nil, pg.ErrNotFound
	}
	s, err := cs.cfg.Streams.Find(ctx, streamName)
	if err != nil {
		return nil, err
	}
	if !cs.keeper.Opened() {
		return nil, errStopping
	}
	id, ok, err := cs.keeper.TryLock(ctx, pg.ConsumerKey{StreamID: s.ID(), Name: consumerName})
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, pg.ErrServedElsewhere
	}
	return cs.serveLocked(ctx, s, consumerName, id)
}

// errStopping is what work refused because the engine is stopping fails with.
var errStopping = errors.New("bridge: stopping")

// Progress reports the progress of the consumer a stored row describes when this replica
// serves it: on the same stream and of the same creation, not a consumer deleted and made
// again.
func (cs *Engine) Progress(s *stream.Stream, row pg.Consumer) (retention.ConsumerProgress, bool) {
	c := cs.find(s.Name(), row.Name)
	if c == nil || c.sc.s != s || !c.created.Equal(row.Created) {
		return retention.ConsumerProgress{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return retention.ConsumerProgress{Floor: c.st.AckFloor().Stream, Next: c.st.Next(), Pending: c.st.PendingSeqs()}, true
}

// Filters reports the filter subjects of each of s's consumers this replica serves.
func (cs *Engine) Filters(s *stream.Stream) [][]string {
	sc := cs.registry(s)
	if sc == nil {
		return nil
	}
	cons := sc.list()
	filters := make([][]string, len(cons))
	for i, c := range cons {
		filters[i] = c.filters()
	}
	return filters
}
