package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/pg"
)

const (
	// TickPeriodDefault is the ticker's polling period while consumers wait. Commits made by
	// this process reach waiting consumers at once, without a tick; the ticker only finds
	// commits made by other replicas, so its period bounds their end-to-end latency. 50 ms
	// keeps that near the time a client takes to notice, and costs one indexed statement per
	// tick for all streams together.
	TickPeriodDefault = 50 * time.Millisecond
	// TickIdleMaxDefault is how far the ticker backs off, doubling its period, while the
	// high-water marks it polls do not move.
	TickIdleMaxDefault = time.Second

	// consumerQueueMax bounds the pull requests and acks waiting for one consumer's
	// goroutine; beyond it pull requests get 409 and acks are dropped (and redelivered).
	consumerQueueMax = 1 << 16
	// activationsMax bounds the consumers being loaded from PostgreSQL at once because a
	// request named one this process does not serve yet.
	activationsMax = 16
)

// consumerSide is the consumer half of the bridge: every pull consumer this process serves,
// the ack subscription, the ticker and the lease keeper.
type consumerSide struct {
	b     *Bridge
	owner string
	m     *consumerMetrics
	// g runs the ticker, the lease keeper, every consumer's goroutine and their background
	// reads and cursor writes; ctx is its context, nil until startConsumers.
	g       startstop.Group
	ctx     context.Context
	ackSub  *leaf.Subscription
	kick    chan struct{}
	activeN chan struct{} // activation slots

	mu      sync.RWMutex
	streams map[*stream.Stream]*streamConsumers

	// own says which consumers this replica serves; see replicas.go.
	own *ownership
	// ownKick makes the ownership loop look at once: a consumer may have been deleted, or
	// freed, elsewhere.
	ownKick chan struct{}

	// fcSub takes the answers to push consumers' flow-control requests.
	fcSub *leaf.Subscription
	// pushMu guards pushers, the push consumers the interest watcher looks after.
	pushMu  sync.Mutex
	pushers map[*consumer]struct{}
}

// streamConsumers is one stream's consumers.
type streamConsumers struct {
	s     *stream.Stream
	reads sharedReads

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

func (b *Bridge) cs() *consumerSide { return b.cons }

// registry returns the stream's consumer registry, nil when it has none yet.
func (cs *consumerSide) registry(s *stream.Stream) *streamConsumers {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	return cs.streams[s]
}

// consumersOf is registry for callers on the stream side, which may run before the consumer
// side exists or after it stopped.
func (b *Bridge) consumersOf(s *stream.Stream) *streamConsumers {
	if cs := b.cs(); cs != nil {
		return cs.registry(s)
	}
	return nil
}

func (b *Bridge) initConsumers(reg prometheus.Registerer) {
	cs := &consumerSide{
		b:       b,
		owner:   b.cfg.ReplicaName,
		kick:    make(chan struct{}, 1),
		activeN: make(chan struct{}, activationsMax),
		streams: make(map[*stream.Stream]*streamConsumers),
	}
	cs.ownKick = make(chan struct{}, 1)
	cs.m = newConsumerMetrics(reg, cs)
	cs.own = newOwnership(reg, cs)
	b.cons = cs
}

// startConsumers subscribes the ack subjects, takes the leases of every stored consumer it
// can and starts serving them, the ticker and the lease keeper. ctx bounds the loading; the
// consumers live until stopConsumers, which also undoes a start that failed part-way.
func (b *Bridge) startConsumers(ctx context.Context) error {
	cs := b.cs()
	cctx, err := cs.g.Start(b.ctx)
	if err != nil {
		return err
	}
	cs.ctx = cctx
	// Ownership is a session of its own; PostgreSQL gives a replica that is cut off its
	// keepalive probes only after a whole lease of silence.
	if cs.own.own, err = b.db.OpenOwnership(ctx, b.clock, b.cfg.Lease, b.cfg.Lease/confirmsPerLease); err != nil {
		return err
	}
	if b.fwdKey, err = b.db.DeploymentSecret(ctx); err != nil {
		return err
	}
	// Before any consumer is served here: other replicas forward its updates once its lease
	// names this one.
	if cs.own.fwd, err = b.link.Subscribe(b.forwardPrefix(cs.owner)+"*.*.CONSUMER.>", "", b.onAPI); err != nil {
		return err
	}
	if serve := cs.claimFree(ctx); serve != nil {
		serve(ctx)
	}
	sub, err := b.link.SubscribeBorrowed(jswire.AckPrefix+">", "", cs.onAck)
	if err != nil {
		return err
	}
	cs.ackSub = sub
	if cs.fcSub, err = b.link.SubscribeBorrowed(jswire.FCPrefix+">", "", cs.onFlowControl); err != nil {
		return err
	}
	cs.g.Go(cs.interestLoop)
	cs.g.Go(cs.tickLoop)
	cs.g.Go(cs.ownershipLoop)
	return nil
}

// stopConsumers stops every consumer goroutine, lets the cursor writes in flight finish,
// writes every floor not yet persisted and gives the leases back. ctx bounds the wait.
func (b *Bridge) stopConsumers(ctx context.Context) {
	cs := b.cs()
	if cs == nil {
		return
	}
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
	if cs.own.fwd != nil {
		_ = cs.own.fwd.Unsubscribe()
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
		c.flushCursor(ctx)
	}
	cs.g.Stop()
	if err := b.db.ClearOwner(context.WithoutCancel(ctx), cs.owner); err != nil {
		b.log.Warn("clearing this replica from its consumers failed", "err", err)
	}
	if cs.own.own != nil {
		cs.own.own.Close()
	}
}

// onCommitted wakes the consumers waiting for rows that s's tail just took: the
// local-commit fast path, no tick needed.
func (cs *consumerSide) OnCommitted(s *stream.Stream, ev stream.Committed) {
	if len(ev.Stored) == 0 {
		return
	}
	sc := cs.registry(s)
	if sc == nil {
		return
	}
	for _, c := range sc.list() {
		c.committed(ev.Stored, ev.Stored[0].Seq)
	}
}

// onDropped stops serving a deleted stream's consumers; PostgreSQL removed their rows with
// the stream.
func (cs *consumerSide) OnDropped(s *stream.Stream, _ stream.Dropped) {
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

// onPurged makes the consumers forget rows they read or counted that may be gone, and
// moves them as a purge request moves them (see purgeMoves).
func (cs *consumerSide) OnPurged(ctx context.Context, s *stream.Stream, ev stream.Purged) {
	if ev.Consumed {
		return
	}
	sc := cs.registry(s)
	if sc == nil {
		return
	}
	sc.reads.forget()
	for _, c := range sc.list() {
		c.markStale(allRows)
		c.postControl(event{kind: evPurged})
	}
	if ev.Request {
		cs.purgeMoves(ctx, sc, ev.Subject)
	}
}

// purgeMoves moves the consumers that nats-server moves after a purge request: all of
// them for a purge of every subject; for a purge of a subject, one whose filters equal it
// or lie inside it, up to the first message left on that subject, and one whose filters
// reach beyond it but cover it (wider), up to the stream's first sequence, dropping its
// pending deliveries of purged messages. Consumers whose filters only partly overlap the
// subject stay where they are, as there.
func (cs *consumerSide) purgeMoves(ctx context.Context, sc *streamConsumers, subject string) {
	b, s := cs.b, sc.s
	st, err := b.db.State(ctx, s.ID())
	if err != nil {
		b.log.Warn("stream state after a purge", "stream", s.Name(), "err", err)
		return
	}
	first := st.FirstSeq
	if st.Msgs == 0 {
		first = st.LastSeq + 1
	}
	left := first
	if subject != "" {
		// 0 when nothing is left on the subject: Purged then moves past the last sequence.
		left = 0
		m, err := b.db.NextBySubject(ctx, s.ID(), subject, first)
		switch {
		case err == nil:
			left = m.Seq
		case !errors.Is(err, pg.ErrNotFound):
			b.log.Warn("first message left after a purge", "stream", s.Name(), "err", err)
			return
		}
		if st.Msgs == 0 {
			left = first
		}
	}
	for _, c := range sc.list() {
		move := &purgeMove{start: left, last: st.LastSeq}
		if subject != "" {
			f := c.filters()
			inside := equalOrInside(f, subject)
			if !inside && !covers(f, subject) {
				continue
			}
			if !inside || !allInside(f, subject) {
				move.start, move.wider = first, true
				if move.gone, err = b.goneOf(ctx, s, c); err != nil {
					b.log.Warn("pending messages after a purge", "stream", s.Name(), "consumer", c.name, "err", err)
					continue
				}
			}
		}
		c.postControl(event{kind: evPurged, purge: move})
	}
}

// purgeMove is how a purge moves one consumer: the arguments of consumerstate's Purged.
type purgeMove struct {
	start, last uint64
	wider       bool
	gone        map[uint64]bool // the consumer's pending deliveries that the purge removed
}

func (p *purgeMove) isGone(seq uint64) bool { return p.gone[seq] }

// goneOf finds which of a consumer's pending deliveries no longer exist. Deliveries made
// after the purge are of messages it left, so a snapshot taken now is enough.
func (b *Bridge) goneOf(ctx context.Context, s *stream.Stream, c *consumer) (map[uint64]bool, error) {
	c.mu.Lock()
	pending := c.st.PendingSeqs()
	c.mu.Unlock()
	if len(pending) == 0 {
		return nil, nil
	}
	gone, err := b.db.GoneSeqs(ctx, s.ID(), pending)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]bool, len(gone))
	for _, seq := range gone {
		out[seq] = true
	}
	return out, nil
}

// equalOrInside reports whether one of a consumer's filters equals subject or lies inside
// it; no filters lie inside no subject.
func equalOrInside(filters []string, subject string) bool {
	return slices.ContainsFunc(filters, func(f string) bool { return f == subject || server.SubjectMatchesFilter(f, subject) })
}

// covers reports whether subject lies inside one of a consumer's filters; a consumer
// without filters covers every subject.
func covers(filters []string, subject string) bool {
	return len(filters) == 0 || slices.ContainsFunc(filters, func(f string) bool { return f == subject || server.SubjectMatchesFilter(subject, f) })
}

// allInside reports whether every one of a consumer's filters lies inside subject.
func allInside(filters []string, subject string) bool {
	return len(filters) > 0 && !slices.ContainsFunc(filters, func(f string) bool { return !server.SubjectMatchesFilter(f, subject) })
}

// onRemoved tells the consumers that rows they may have counted as pending went.
func (cs *consumerSide) OnRemoved(s *stream.Stream, ev stream.Removed) {
	if ev.Unread == 0 {
		return
	}
	if sc := cs.registry(s); sc != nil {
		for _, c := range sc.list() {
			c.markStale(ev.Unread)
		}
	}
}

// handlePullRequest takes a pull request that reached this replica through the $JS.API
// queue group. The replica serving the consumer has its own subscription to the consumer's
// subject and so has the request already, whether it is this one or another: only a request
// for a consumer served nowhere is taken here, by taking the consumer over.
func (b *Bridge) handlePullRequest(m *leaf.Msg, streamName, consumerName string) {
	cs := b.cs()
	if cs == nil || cs.own.holds(streamName, consumerName) || b.link.HasQueueInterest(m.Subject, "") {
		return
	}
	b.servePull(m, streamName, consumerName)
}

// servePull runs on the link's read loop: it only hands the request to the consumer's
// goroutine, in arrival order with that consumer's acks.
func (b *Bridge) servePull(m *leaf.Msg, streamName, consumerName string) {
	if m.Reply == "" {
		return
	}
	cs := b.cs()
	if cs == nil {
		return
	}
	ev := event{kind: evPull, reply: m.Reply, data: m.Data}
	if c := cs.find(streamName, consumerName); c != nil {
		if !c.post(ev) {
			_ = b.link.Publish(m.Reply, "", jswire.StatusHeader(409, jswire.DescMaxWaiting), nil)
		}
		return
	}
	cs.activateLater(streamName, consumerName, ev)
}

// find returns the consumer if this process serves it.
func (cs *consumerSide) find(streamName, consumerName string) *consumer {
	s := cs.b.streams.Lookup(streamName)
	if s == nil {
		return nil
	}
	return cs.served(s, consumerName)
}

// served returns s's consumer of that name if this process serves it.
func (cs *consumerSide) served(s *stream.Stream, consumerName string) *consumer {
	sc := cs.registry(s)
	if sc == nil {
		return nil
	}
	return sc.get(consumerName)
}

// registryFor returns the stream's consumer registry, creating it.
func (cs *consumerSide) registryFor(s *stream.Stream) *streamConsumers {
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
func (cs *consumerSide) streamLoaded(ctx context.Context, s *stream.Stream) (*streamConsumers, error) {
	sc := cs.registry(s)
	if sc != nil {
		return sc, nil
	}
	if !s.Tail().Started() {
		hw, err := cs.b.db.HighWater(ctx, []int64{s.ID()})
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
func (cs *consumerSide) activate(ctx context.Context, sc *streamConsumers, row pg.Consumer, start *startPos) (*consumer, error) {
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
	from, extra := c.countFrom()
	npc, err := cs.b.db.CountPending(ctx, pg.PendingParams{StreamID: sc.s.ID(), From: from, UpTo: hw, Filters: c.filters()})
	if err != nil {
		cs.release(row.ID)
		return nil, err
	}
	c.npc = int64(npc + extra)
	c.counted.Store(c.st.Next())
	c.pend.through.Store(hw) // no commit reaches c before it is registered below
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
func (cs *consumerSide) release(id int64) {
	if own := cs.own.own; own != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cs.b.cfg.Lease)
		defer cancel()
		_ = own.Unlock(ctx, id)
	}
}

// remove forgets a consumer that stopped.
func (cs *consumerSide) remove(c *consumer) {
	c.sc.mu.Lock()
	if c.sc.cons[c.name] == c {
		delete(c.sc.cons, c.name)
	}
	c.sc.mu.Unlock()
	cs.trackPush(c, false)
	cs.unhold(c)
}

// activateLater loads a consumer that a request named but this process does not serve yet,
// off the read loop, and hands it the request. Another replica may have created it, or it
// may be this process's own consumer whose lease had not expired at start.
func (cs *consumerSide) activateLater(streamName, consumerName string, ev event) {
	select {
	case cs.activeN <- struct{}{}:
	default:
		_ = cs.b.link.Publish(ev.reply, "", jswire.StatusHeader(503, "No Responders"), nil)
		return
	}
	if !cs.g.Go(func() {
		defer func() { <-cs.activeN }()
		c, err := cs.ensure(cs.ctx, streamName, consumerName)
		switch {
		case errors.Is(err, pg.ErrServedElsewhere):
			// Another replica serves it and received the same request.
		case err != nil:
			_ = cs.b.link.Publish(ev.reply, "", jswire.StatusHeader(503, "No Responders"), nil)
		case !c.post(ev):
			_ = cs.b.link.Publish(ev.reply, "", jswire.StatusHeader(409, jswire.DescMaxWaiting), nil)
		}
	}) {
		<-cs.activeN
		_ = cs.b.link.Publish(ev.reply, "", jswire.StatusHeader(503, "No Responders"), nil)
	}
}

// ensure returns the consumer, loading it from PostgreSQL if its lease can be taken.
func (cs *consumerSide) ensure(ctx context.Context, streamName, consumerName string) (*consumer, error) {
	if c := cs.find(streamName, consumerName); c != nil {
		return c, nil
	}
	// Names come from subject tokens, which can be any bytes; no consumer has an invalid
	// name, and PostgreSQL would refuse to look one up.
	if !jswire.ValidName(consumerName) {
		return nil, pg.ErrNotFound
	}
	s, err := cs.b.streams.Find(ctx, streamName)
	if err != nil {
		return nil, err
	}
	own := cs.own.own
	if own == nil {
		return nil, errStopping
	}
	id, ok, err := own.TryLock(ctx, pg.ConsumerKey{StreamID: s.ID(), Name: consumerName})
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, pg.ErrServedElsewhere
	}
	return cs.serveLocked(ctx, s, consumerName, id)
}
