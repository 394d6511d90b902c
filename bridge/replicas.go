package bridge

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg"
)

const (
	// LeaseDefault is Config.Lease's default.
	LeaseDefault = 10 * time.Second
	// QueueGroup is the queue group of every replica's stream-subject and $JS.API
	// subscriptions: NATS hands each publish and each API request to one replica. The
	// bridges are leafnodes of their servers, which nats-server does not prefer over a
	// routed member: the pick is at random.
	QueueGroup = "jetgres"
	// ForwardPrefix begins the subjects on which replicas hand each other consumer requests:
	// ForwardPrefix, the replica's name in hex, the seal (two tokens), and the request's
	// subject after "$JS.API.". Clients have no business there; deployments that restrict
	// subjects can deny it to them, and a request a client sends there is dropped all the
	// same, as its seal cannot be right.
	ForwardPrefix = "$JETGRES.REPLICA."
	// forwardMaxAge is how long a forwarded request's seal holds, either way, for replicas
	// whose clocks disagree a little: a request captured there cannot be replayed later.
	forwardMaxAge = time.Minute

	// claimsPerLease is how many times per lease a replica confirms its ownership session
	// and looks for consumers nobody serves: with the default lease, every 250 ms, which
	// bounds the time a dead replica's consumers stay silent.
	claimsPerLease = 40
	// confirmsPerLease sets the timeout of every statement of the ownership session, a
	// tenth of the lease: one that runs past it breaks the session.
	confirmsPerLease = 10
	// fencePerLease sets the fencing deadline, a fifth of the lease: a replica that has not
	// confirmed its session for that long stops serving every consumer, whatever else it is
	// waiting for. PostgreSQL gives a silent session's locks away only after a whole lease.
	fencePerLease = 5
)

// consumerRef names a consumer by its stream's name, as requests do.
type consumerRef struct{ stream, consumer string }

// heldNext is the MSG.NEXT subscription of a consumer this replica serves.
type heldNext struct {
	c   *consumer
	sub *leaf.Subscription
}

// ownership is the consumer side's share of several replicas: the session whose advisory
// locks say which consumers this replica serves, and the MSG.NEXT subscription of each.
type ownership struct {
	own *pg.Ownership // nil outside startConsumers .. stopConsumers

	// mu guards next. It is a leaf: nothing is taken while it is held.
	mu   sync.Mutex
	next map[consumerRef]heldNext

	// fwd receives the consumer requests other replicas forward to this one.
	fwd *leaf.Subscription

	served    prometheus.GaugeFunc
	takeovers prometheus.Counter
	fencings  prometheus.Counter
	forwards  prometheus.Counter
	refused   prometheus.Counter
}

func newOwnership(reg prometheus.Registerer, cs *consumerSide) *ownership {
	o := &ownership{
		next: make(map[consumerRef]heldNext),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_takeovers_total",
			Help: "Consumers this replica took over from another replica that had served them."}),
		fencings: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_fencings_total",
			Help: "Times this replica could not confirm its ownership session and stopped serving every consumer."}),
		forwards: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_requests_forwarded_total",
			Help: "Consumer updates, pauses and info requests this replica forwarded to the replica that serves the consumer."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_forwards_refused_total",
			Help: "Requests on this replica's forwarding subjects dropped because their seal was wrong or too old: not sent by a replica."}),
	}
	o.served = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "jetgres_consumers_served",
		Help: "Consumers this replica serves."}, func() float64 { return float64(o.count()) })
	if reg != nil {
		reg.MustRegister(o.served, o.takeovers, o.fencings, o.forwards, o.refused)
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
func (cs *consumerSide) hold(c *consumer) {
	ref := consumerRef{c.sc.s.name, c.name}
	subj := apiMsgNext + ref.stream + "." + ref.consumer
	sub, err := cs.b.link.Subscribe(subj, "", func(m *leaf.Msg) { cs.b.servePull(m, ref.stream, ref.consumer) })
	if err != nil {
		cs.b.log.Warn("subscribing a consumer's pull requests failed", "stream", ref.stream, "consumer", ref.consumer, "err", err)
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
func (cs *consumerSide) unhold(c *consumer) {
	ref := consumerRef{c.sc.s.name, c.name}
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
		k := pg.ConsumerKey{StreamID: c.sc.s.id, Name: c.name}
		// Off the caller's locks: the statement waits for the ownership session.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), cs.b.cfg.Lease)
			defer cancel()
			_ = own.Unlock(ctx, k)
		}()
	}
}

// claim takes the consumer's lock and lease, or fails with pg.ErrLeaseHeld when another
// replica's session holds the lock.
func (cs *consumerSide) claim(ctx context.Context, s *stream, name string) (pg.Consumer, error) {
	own := cs.own.own
	if own == nil {
		return pg.Consumer{}, errStopping
	}
	k := pg.ConsumerKey{StreamID: s.id, Name: name}
	ok, err := own.TryLock(ctx, k)
	if err != nil {
		return pg.Consumer{}, err
	}
	if !ok {
		return pg.Consumer{}, pg.ErrLeaseHeld
	}
	return cs.takeLease(ctx, k)
}

// takeLease records this replica as the server of a consumer whose lock it holds.
func (cs *consumerSide) takeLease(ctx context.Context, k pg.ConsumerKey) (pg.Consumer, error) {
	row, prev, err := cs.b.db.TakeLease(ctx, pg.LeaseParams{StreamID: k.StreamID, Name: k.Name, Owner: cs.owner, TTL: cs.b.cfg.Lease})
	if err != nil {
		_ = cs.own.own.Unlock(context.WithoutCancel(ctx), k)
		return pg.Consumer{}, err
	}
	if prev != "" && prev != cs.owner {
		cs.own.takeovers.Inc()
		cs.b.log.Info("took a consumer over", "stream_id", k.StreamID, "consumer", k.Name, "from", prev)
	}
	return row, nil
}

// ownershipLoop confirms the ownership session and takes over the consumers nobody serves,
// claimsPerLease times per lease. When the session cannot be confirmed, this replica stops
// serving every consumer at once: PostgreSQL may already have given their locks to another.
// It runs on the bridge's clock, as the lease loop does.
func (cs *consumerSide) ownershipLoop() {
	lease := cs.b.cfg.Lease
	t := cs.b.clock.NewTicker(lease / claimsPerLease)
	defer t.Stop()
	for {
		select {
		case <-cs.ctx.Done():
			return
		case <-t.C():
		}
		own := cs.own.own
		if !own.Connected() {
			// The session is gone, and its locks with it, or soon.
			cs.fence(pg.ErrOwnershipLost)
			if err := own.Reconnect(cs.ctx); err != nil {
				if cs.ctx.Err() == nil {
					cs.b.warnOwnSession.warn(cs.b.log, cs.b.clock.Now(), "reconnecting the ownership session failed", "err", err)
				}
				continue
			}
		}
		if err := own.Confirm(cs.ctx); err != nil {
			if cs.ctx.Err() == nil {
				cs.fence(err)
			}
			continue
		}
		cs.claimFree(cs.ctx)
	}
}

// fenceLoop stops serving every consumer once the ownership session has not been confirmed
// within the fencing deadline, even while the ownership loop waits on a statement or a
// connection. It looks and measures on the bridge's clock, on which the session stamps its
// confirmations. PostgreSQL's keepalives, which end a silent session, run in real time: on
// the system clock, the only one outside tests, the deadline falls well before they do.
func (cs *consumerSide) fenceLoop() {
	lease := cs.b.cfg.Lease
	t := cs.b.clock.NewTicker(lease / claimsPerLease)
	defer t.Stop()
	for {
		select {
		case <-cs.ctx.Done():
			return
		case <-t.C():
		}
		if last := cs.own.own.Confirmed(); last.IsZero() || cs.b.clock.Now().Sub(last) > lease/fencePerLease {
			cs.fence(errors.New("ownership session not confirmed within the fencing deadline"))
		}
	}
}

// fence stops serving every consumer: their locks can no longer be vouched for.
func (cs *consumerSide) fence(cause error) {
	all := cs.all()
	if len(all) == 0 {
		return
	}
	cs.own.fencings.Inc()
	cs.b.log.Warn("ownership session lost: stopping every consumer this replica serves", "consumers", len(all), "err", cause)
	for _, c := range all {
		c.stop(stopLost)
	}
}

func (cs *consumerSide) all() []*consumer {
	cs.mu.RLock()
	defer cs.mu.RUnlock()
	var out []*consumer
	for _, sc := range cs.streams {
		out = append(out, sc.list()...)
	}
	return out
}

// claimFree takes over every consumer of a known stream that no replica serves.
func (cs *consumerSide) claimFree(ctx context.Context) {
	streams := cs.b.streamList()
	if len(streams) == 0 {
		return
	}
	byID := make(map[int64]*stream, len(streams))
	ids := make([]int64, 0, len(streams))
	for _, s := range streams {
		byID[s.id] = s
		ids = append(ids, s.id)
	}
	keys, err := cs.own.own.ClaimFree(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			cs.b.warnUnserved.warn(cs.b.log, cs.b.clock.Now(), "looking for consumers nobody serves failed", "err", err)
		}
		return
	}
	for _, k := range keys {
		s := byID[k.StreamID]
		if err := cs.serveClaimed(ctx, s, k); err != nil && !errors.Is(err, errStopping) && ctx.Err() == nil {
			cs.b.log.Warn("taking a consumer over failed", "stream", s.name, "consumer", k.Name, "err", err)
		}
	}
}

// serveClaimed starts serving a consumer whose lock this replica just took.
func (cs *consumerSide) serveClaimed(ctx context.Context, s *stream, k pg.ConsumerKey) error {
	if cs.served(s, k.Name) != nil {
		// Still stopping after a fence: the lock is this session's now, the next pass serves it.
		return cs.own.own.Unlock(ctx, k)
	}
	row, err := cs.takeLease(ctx, k)
	if errors.Is(err, pg.ErrNotFound) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	sc, err := cs.streamLoaded(ctx, s)
	if err != nil {
		_ = cs.own.own.Unlock(context.WithoutCancel(ctx), k)
		return err
	}
	_, err = cs.activate(ctx, sc, row, nil)
	return err
}

// lockNew takes the lock of a consumer about to be created here.
func (cs *consumerSide) lockNew(ctx context.Context, s *stream, name string) (bool, error) {
	own := cs.own.own
	if own == nil {
		return false, errStopping
	}
	return own.TryLock(ctx, pg.ConsumerKey{StreamID: s.id, Name: name})
}

// forwardPrefix is where the replica called name receives forwarded requests. The name is
// in hex: a replica's default name has dots and colons, which a subject token cannot hold.
func (b *Bridge) forwardPrefix(name string) string {
	return ForwardPrefix + hex.EncodeToString([]byte(name)) + "."
}

// errForwarded says that forward sent the request on: its answer comes from there.
var errForwarded = errors.New("forwarded to the consumer's replica")

// forward sends a consumer request that err says another replica serves to that replica,
// with the client's reply subject, so that the replica holding the consumer's state decides
// and answers it exactly as if it had received it, as a JetStream consumer's leader does.
// It returns errForwarded then, and otherwise the error to answer with: a request forwarded
// once is never forwarded again (the lock may have moved meanwhile), and one whose replica
// the server does not know of (no cluster, or the owner just died and another holds the
// lock before its lease names it) is refused as before.
func (b *Bridge) forward(m *leaf.Msg, err error, forwarded bool) error {
	var sb *servedBy
	if !errors.As(err, &sb) {
		return err
	}
	refuse := server.NewJSConsumerCreateError(errServedElsewhere)
	if forwarded || sb.owner == "" || sb.owner == b.cfg.ReplicaName {
		return refuse
	}
	api := strings.TrimPrefix(m.Subject, apiPrefix)
	subj := b.forwardPrefix(sb.owner) + b.seal(b.clock.Now().Unix(), api, m) + "." + api
	if !b.link.HasInterest(subj) {
		return refuse
	}
	if e := b.link.Publish(subj, m.Reply, m.Header, m.Data); e != nil {
		return refuse
	}
	b.cons.own.forwards.Inc()
	return errForwarded
}

// seal is the two subject tokens that vouch for a forwarded request: when it was sealed, in
// unix seconds, and a MAC with the deployment's secret over that time and everything the
// receiving replica acts on.
func (b *Bridge) seal(unix int64, api string, m *leaf.Msg) string {
	ts := strconv.FormatInt(unix, 10)
	mac := hmac.New(sha256.New, b.fwdKey)
	for _, part := range [][]byte{[]byte(ts), []byte(api), []byte(m.Reply), m.Header} {
		mac.Write(part)
		mac.Write([]byte{0})
	}
	mac.Write(m.Data)
	return ts + "." + hex.EncodeToString(mac.Sum(nil)[:16])
}

// unseal checks the seal of a request forwarded here, rest being its subject after
// ownForward, and returns its subject after "$JS.API.".
func (b *Bridge) unseal(rest string, m *leaf.Msg) (api string, ok bool) {
	ts, after, _ := strings.Cut(rest, ".")
	mac, api, _ := strings.Cut(after, ".")
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || api == "" || len(b.fwdKey) == 0 {
		return "", false
	}
	if age := b.clock.Now().Sub(time.Unix(unix, 0)); age > forwardMaxAge || age < -forwardMaxAge {
		return "", false
	}
	return api, hmac.Equal([]byte(ts+"."+mac), []byte(b.seal(unix, api, m)))
}

// servedBy names the replica whose lease says it serves a consumer that another session
// holds the lock of.
func (cs *consumerSide) servedBy(ctx context.Context, s *stream, name string) error {
	row, err := cs.b.db.GetConsumer(ctx, s.id, name)
	switch {
	case errors.Is(err, pg.ErrNotFound):
		// Deleted since its lock was found held.
		return server.NewJSConsumerNotFoundError()
	case err != nil:
		// Which replica serves it is unknown; the database's failure is the answer, never
		// a claim that another replica serves it.
		return fmt.Errorf("looking up the replica serving consumer %q on stream %q: %w", name, s.name, err)
	}
	return &servedBy{owner: row.Owner}
}

// clusterInfo is the cluster block of consumer info, as JetStream reports its cluster and
// the leader: the replica that serves the consumer, or this one while none does. As
// nats-server, which reports it for a consumer only in cluster mode, there is none without
// a cluster.
func (b *Bridge) clusterInfo(leader string) *server.ClusterInfo {
	if b.cfg.ClusterName == "" {
		return nil
	}
	if leader == "" {
		leader = b.cfg.ReplicaName
	}
	return &server.ClusterInfo{Name: b.cfg.ClusterName, Leader: leader}
}

// streamClusterInfo is the cluster block of stream info: nats-server reports it for every
// stream, outside cluster mode too (no name, itself the leader), and clients print it
// ("Cluster Information"). The leader is the replica that answers: every replica appends.
func (b *Bridge) streamClusterInfo() *server.ClusterInfo {
	return &server.ClusterInfo{Name: b.cfg.ClusterName, Leader: b.cfg.ReplicaName}
}
