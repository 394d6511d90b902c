package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg"
)

const (
	// LeaseDefault is Config.Lease's default.
	LeaseDefault = 10 * time.Second
	// apiMsgNext begins the subject of a consumer's pull requests, followed by its stream
	// and its name.
	apiMsgNext = "$JS.API.CONSUMER.MSG.NEXT."

	// ClaimsPerLease is how many times per lease a replica confirms its ownership session
	// and looks for consumers nobody serves: with the default lease, every 250 ms, which
	// bounds the time a dead replica's consumers stay silent.
	ClaimsPerLease = 40
	// confirmsPerLease sets the timeout of every statement of the ownership session, a
	// tenth of the lease: one that runs past it breaks the session.
	confirmsPerLease = 10
	// DeletedChecksPerLease is how often per lease the ownership loop reads which of its
	// consumers were deleted, should the notification of a deletion be lost.
	DeletedChecksPerLease = 3
	// FencePerLease sets the fencing deadline, a fifth of the lease: a replica that has not
	// confirmed its session for that long stops serving every consumer, whatever else it is
	// waiting for. PostgreSQL gives a silent session's locks away only after a whole lease.
	FencePerLease = 5
)

// consumerRef names a consumer by its stream's name, as requests do.
type consumerRef struct{ stream, consumer string }

// heldNext is the MSG.NEXT subscription of a consumer this replica serves.
type heldNext struct {
	c   *consumer
	sub *leaf.Subscription
}

// ownership is the engine's share of several replicas: the session whose advisory
// locks say which consumers this replica serves, and the MSG.NEXT subscription of each.
type ownership struct {
	own *pg.Ownership // nil outside Start .. Stop

	// mu guards next. It is a leaf: nothing is taken while it is held.
	mu   sync.Mutex
	next map[consumerRef]heldNext

	served    prometheus.GaugeFunc
	takeovers prometheus.Counter
	fencings  prometheus.Counter
}

func newOwnership(reg prometheus.Registerer, cs *Engine) *ownership {
	o := &ownership{
		next: make(map[consumerRef]heldNext),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_takeovers_total",
			Help: "Consumers this replica took over from another replica that had served them."}),
		fencings: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_fencings_total",
			Help: "Times this replica could not confirm its ownership session and stopped serving every consumer."}),
	}
	o.served = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_consumers_served",
		Help: "Consumers this replica serves."}, func() float64 { return float64(o.count()) })
	if reg != nil {
		reg.MustRegister(o.served, o.takeovers, o.fencings)
	}
	return o
}

func (o *ownership) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.next)
}

// holds reports whether this replica's own subscription to the consumer's MSG.NEXT subject
// receives its pull requests.
func (o *ownership) holds(streamName, consumerName string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.next[consumerRef{streamName, consumerName}]
	return ok
}

// hold subscribes the consumer's own MSG.NEXT subject, so that its pull requests reach this
// replica wherever the client is connected, as they reach a JetStream consumer's leader.
func (cs *Engine) hold(c *consumer) {
	ref := consumerRef{c.sc.s.Name(), c.name}
	subj := apiMsgNext + ref.stream + "." + ref.consumer
	sub, err := cs.link.Subscribe(subj, "", func(m *leaf.Msg) { cs.servePull(m, ref.stream, ref.consumer) })
	if err != nil {
		cs.log.Warn("subscribing a consumer's pull requests failed", "stream", ref.stream, "consumer", ref.consumer, "err", err)
		return
	}
	o := cs.own
	o.mu.Lock()
	old, had := o.next[ref]
	o.next[ref] = heldNext{c, sub}
	o.mu.Unlock()
	if had {
		_ = old.sub.Unsubscribe()
	}
}

// unhold drops the consumer's MSG.NEXT subscription and gives its lock back, so that another
// replica may serve it.
func (cs *Engine) unhold(c *consumer) {
	ref := consumerRef{c.sc.s.Name(), c.name}
	o := cs.own
	o.mu.Lock()
	h, ok := o.next[ref]
	if ok && h.c == c {
		delete(o.next, ref)
	}
	o.mu.Unlock()
	if !ok || h.c != c {
		return
	}
	_ = h.sub.Unsubscribe()
	if own := o.own; own != nil {
		k := pg.ConsumerKey{StreamID: c.sc.s.ID(), Name: c.name}
		// Off the caller's locks: the statement waits for the ownership session.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), cs.cfg.Lease)
			defer cancel()
			_ = own.Unlock(ctx, k)
		}()
	}
}

// ownershipLoop keeps this replica's claim on the consumers it serves, ClaimsPerLease times
// per lease and whenever a consumer changed anywhere. It stops serving every consumer at once
// (fences) when the ownership session is gone, fails a statement, or was last confirmed
// longer ago than the fencing deadline; it stops those deleted by any replica; and it takes
// over this replica's share of those nobody serves. Everything it waits for is a statement
// on the ownership session, bounded by a tenth of the lease, whose failure fences, and the
// consumers it takes over are loaded and served off the loop: so it looks again well within
// the fencing deadline, however slow the database is, and no other loop is needed.
func (cs *Engine) ownershipLoop() {
	clock, lease := cs.clock, cs.cfg.Lease
	t := clock.NewTicker(lease / ClaimsPerLease)
	defer t.Stop()
	var checked time.Time
	for {
		check := false
		select {
		case <-cs.ctx.Done():
			return
		case <-t.C():
		case <-cs.ownKick:
			check = true
		}
		own := cs.own.own
		if !own.Connected() {
			// The session is gone, and its locks with it, or soon.
			cs.fence(pg.ErrOwnershipLost)
			if err := own.Reconnect(cs.ctx); err != nil {
				if cs.ctx.Err() == nil {
					cs.warnOwnSession.Warn(cs.log, clock.Now(), "reconnecting the ownership session failed", "err", err)
				}
				continue
			}
		}
		now := clock.Now()
		if last := own.Confirmed(); last.IsZero() || now.Sub(last) > lease/FencePerLease {
			cs.fence(errors.New("ownership session not confirmed within the fencing deadline"))
		}
		// A deletion elsewhere notifies and so kicks; the period is for a lost notification.
		var err error
		if check || now.Sub(checked) >= lease/DeletedChecksPerLease {
			checked = now
			var gone []pg.ConsumerKey
			if gone, err = own.Deleted(cs.ctx); err == nil {
				cs.stopDeleted(gone)
			}
		} else {
			err = own.Confirm(cs.ctx)
		}
		if err != nil {
			if cs.ctx.Err() == nil {
				cs.fence(err)
			}
			continue
		}
		if serve := cs.claimFree(cs.ctx); serve != nil && !cs.g.Go(func() { serve(cs.ctx) }) {
			serve(nil)
		}
	}
}

// stopDeleted stops serving the consumers whose rows are gone.
func (cs *Engine) stopDeleted(gone []pg.ConsumerKey) {
	if len(gone) == 0 {
		return
	}
	byID := make(map[int64]*stream.Stream)
	for _, s := range cs.cfg.Streams.List() {
		byID[s.ID()] = s
	}
	for _, k := range gone {
		s := byID[k.StreamID]
		if s == nil {
			continue // the stream went, and its consumers with it
		}
		// One not served yet is being created or loaded here: its own path gives the
		// lock back if it finds no row, and must keep it if its row is still to commit.
		if c := cs.served(s, k.Name); c != nil {
			c.stop(stopDeleted)
		}
	}
}

// fence stops serving every consumer: their locks can no longer be vouched for.
func (cs *Engine) fence(cause error) {
	all := cs.all()
	if len(all) == 0 {
		return
	}
	cs.own.fencings.Inc()
	cs.log.Warn("ownership session lost: stopping every consumer this replica serves", "consumers", len(all), "err", cause)
	for _, c := range all {
		c.stop(stopLost)
	}
}

func (cs *Engine) all() []*consumer {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	var out []*consumer
	for _, sc := range cs.streams {
		out = append(out, sc.list()...)
	}
	return out
}

// claimFree locks this replica's share of the consumers of known streams that no replica
// serves, and returns what serves them: each is loaded from PostgreSQL and started, which
// the caller may do off its own goroutine. A nil ctx gives the locks back instead, for a
// caller that cannot serve them after all. It returns nil when it locked none.
func (cs *Engine) claimFree(ctx context.Context) func(context.Context) {
	streams := cs.cfg.Streams.List()
	if len(streams) == 0 {
		return nil
	}
	byID := make(map[int64]*stream.Stream, len(streams))
	ids := make([]int64, 0, len(streams))
	for _, s := range streams {
		byID[s.ID()] = s
		ids = append(ids, s.ID())
	}
	keys, err := cs.own.own.ClaimFree(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			cs.warnUnserved.Warn(cs.log, cs.clock.Now(), "looking for consumers nobody serves failed", "err", err)
		}
		return nil
	}
	if len(keys) == 0 {
		return nil
	}
	return func(ctx context.Context) {
		for _, k := range keys {
			s := byID[k.StreamID]
			if ctx == nil {
				cs.release(s, k.Name)
				continue
			}
			if _, err := cs.serveLocked(ctx, s, k.Name); err != nil && !errors.Is(err, errStopping) && !errors.Is(err, pg.ErrNotFound) && ctx.Err() == nil {
				cs.log.Warn("taking a consumer over failed", "stream", s.Name(), "consumer", k.Name, "err", err)
			}
		}
	}
}

// serveLocked starts serving a consumer whose lock this replica has just taken: it records
// this replica as its owner, loads it and starts it. Whatever fails gives the lock back.
func (cs *Engine) serveLocked(ctx context.Context, s *stream.Stream, name string) (*consumer, error) {
	if c := cs.served(s, name); c != nil {
		// Served here already, or still stopping after a fence: the lock counted twice.
		cs.release(s, name)
		return c, nil
	}
	row, prev, err := cs.db.SetOwner(ctx, pg.ConsumerKey{StreamID: s.ID(), Name: name}, cs.owner)
	if err != nil {
		cs.release(s, name)
		return nil, err
	}
	if prev != "" && prev != cs.owner {
		cs.own.takeovers.Inc()
		cs.log.Info("took a consumer over", "stream", s.Name(), "consumer", name, "from", prev)
	}
	sc, err := cs.streamLoaded(ctx, s)
	if err != nil {
		cs.release(s, name)
		return nil, err
	}
	return cs.activate(ctx, sc, row, nil)
}

// servedBy names the replica whose row says it serves a consumer that another session
// holds the lock of.
func (cs *Engine) servedBy(ctx context.Context, s *stream.Stream, name string) error {
	row, err := cs.db.GetConsumer(ctx, s.ID(), name)
	switch {
	case errors.Is(err, pg.ErrNotFound):
		// Deleted since its lock was found held.
		return server.NewJSConsumerNotFoundError()
	case err != nil:
		// Which replica serves it is unknown; the database's failure is the answer, never
		// a claim that another replica serves it.
		return fmt.Errorf("looking up the replica serving consumer %q on stream %q: %w", name, s.Name(), err)
	}
	return &ServedBy{Owner: row.Owner}
}

// clusterInfo is the cluster block of consumer info, as JetStream reports its cluster and
// the leader: the replica that serves the consumer, or this one while none does. As
// nats-server, which reports it for a consumer only in cluster mode, there is none without
// a cluster.
func (cs *Engine) clusterInfo(leader string) *server.ClusterInfo {
	if cs.cfg.ClusterName == "" {
		return nil
	}
	if leader == "" {
		leader = cs.owner
	}
	return &server.ClusterInfo{Name: cs.cfg.ClusterName, Leader: leader}
}
