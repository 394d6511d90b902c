package ownership

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/warnlog"
)

const (
	// ForwardPrefix begins the subjects on which replicas hand each other consumer requests:
	// ForwardPrefix, the receiving replica's name in hex, the seal (three tokens: the
	// sending replica's name in hex, the time, the MAC), and the request's subject after
	// "$JS.API.". Clients have no business there; deployments that restrict subjects can
	// deny it to them, and a request a client sends there is dropped all the same, as its
	// seal cannot be right. A replica that refuses a request sealed by another replica, for
	// its time alone, tells that replica on its own subjects, under refusedToken.
	ForwardPrefix = "$JETGRES.REPLICA."
	// ForwardMaxAge is how long a forwarded request's seal holds, either way: a request
	// captured there cannot be replayed later. Seals are timed on PostgreSQL's clock, as
	// each replica measures it (pg.DB.PGTime), so the replicas' own clocks may be minutes
	// apart; the window covers the error of the measurements and a request's time in flight.
	ForwardMaxAge = time.Minute

	// RefusedSeal and RefusedClock are the reasons a replica refuses a forwarded request,
	// as its refusal counter labels them. RefusedSeal: no replica of this deployment sealed
	// it (a client sent it, or another deployment). RefusedClock: a replica sealed it, but
	// at a time more than ForwardMaxAge from this replica's: the two disagree on
	// PostgreSQL's clock (one could not measure it lately), or the request was replayed.
	RefusedSeal  = "seal"
	RefusedClock = "clock"

	apiPrefix    = "$JS.API."
	refusedToken = "REFUSED"
)

var (
	// ErrServedElsewhere refuses changes to a consumer whose lock another replica holds,
	// when the request cannot reach that replica.
	ErrServedElsewhere = errors.New("consumer is served by another replica")
	// ErrForwarded says that Forward sent the request on: its answer comes from there.
	ErrForwarded = errors.New("forwarded to the consumer's replica")
	// ErrForwardRefused answers a request that the consumer's replica refused, forwarded
	// to it by another replica, for the time of its seal.
	ErrForwardRefused = errors.New("consumer is served by another replica, which refused this request forwarded to it: the replicas disagree on the time")
)

// ServedBy says that the replica called Owner serves the consumer a request would change:
// the request belongs there (see Forwarder.Forward).
type ServedBy struct{ Owner string }

func (e *ServedBy) Error() string { return ErrServedElsewhere.Error() }

// SecretStore reads the deployment's secret that seals forwarded requests, and the time
// on PostgreSQL's clock that seals are timed by; *pg.DB satisfies it.
type SecretStore interface {
	DeploymentSecret(ctx context.Context) ([]byte, error)
	// MeasureClock measures how far clk is from PostgreSQL's clock, which PGTime then
	// corrects by, as the ownership session's confirmations keep doing.
	MeasureClock(ctx context.Context, clk clock.Clock) (time.Duration, error)
	PGTime(t time.Time) time.Time
}

// ForwarderConfig configures a Forwarder. Every field is required but Logger and
// Registerer.
type ForwarderConfig struct {
	Store SecretStore
	Link  *leaf.Conn
	Clock clock.Clock
	// Logger receives the refusals, thinned. Defaults to discarding them.
	Logger *slog.Logger
	// Registerer receives the forwarder's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// ReplicaName is this replica's name, as other replicas forward to it.
	ReplicaName string
}

// Forwarder sends a consumer request to the replica that serves the consumer, as JetStream
// sends such requests to the consumer's leader, and takes those other replicas send here.
// A forwarded request is sealed with a MAC over it, its sender and the time, keyed with
// the deployment's secret, and dropped without it: the forwarding subjects would otherwise
// let a client that may publish anywhere past the server's permissions on $JS.API.
//
// A refusal is loud: the refusing replica logs it and counts it by reason (and, for a
// replica's seal, by the replica); a request a replica did seal, at a time out of the
// window, is answered with ErrForwardRefused, and its sender is told, which logs and counts
// it too. A request no replica sealed is not answered: it did not come from a replica.
type Forwarder struct {
	cfg ForwarderConfig
	log *slog.Logger
	// own is Prefix(cfg.ReplicaName): the subjects of the requests forwarded here.
	own string
	// key is the deployment's secret, read by Start.
	key        []byte
	sub, notes *leaf.Subscription

	warnForged, warnClock, warnRefusedThere warnlog.Throttle

	forwards prometheus.Counter
	// refused counts refusals here by reason and by the sending replica, "" when no
	// replica sealed the request; refusedThere counts those of this replica's requests
	// by the replica that refused them.
	refused, refusedThere *prometheus.CounterVec
}

// NewForwarder builds a Forwarder; Start makes it take forwarded requests.
func NewForwarder(cfg ForwarderConfig) *Forwarder {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Forwarder{
		cfg: cfg,
		log: log,
		forwards: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_requests_forwarded_total",
			Help: "Consumer updates, pauses and info requests this replica forwarded to the replica that serves the consumer."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jetgres_consumer_forwards_refused_total",
			Help: "Requests on this replica's forwarding subjects it dropped, by reason: seal (not sealed by a replica of this deployment; replica is empty) " +
				"or clock (sealed by that replica at a time more than a minute from this one's on PostgreSQL's clock, or replayed)."}, []string{"reason", "replica"}),
		refusedThere: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jetgres_consumer_forwards_refused_elsewhere_total",
			Help: "Requests this replica forwarded that the replica serving the consumer refused for their time: the two disagree on PostgreSQL's clock, by that replica."}, []string{"replica"}),
	}
	f.own = f.Prefix(cfg.ReplicaName)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(f.forwards, f.refused, f.refusedThere)
	}
	return f
}

// Start reads the deployment's secret, measures this replica's clock against PostgreSQL's,
// and subscribes the consumer requests other replicas forward here, handing each to
// handle, and their refusals of this replica's. It must come before this replica serves
// any consumer: other replicas forward a consumer's requests once its row names this one.
func (f *Forwarder) Start(ctx context.Context, handle leaf.Handler) error {
	key, err := f.cfg.Store.DeploymentSecret(ctx)
	if err != nil {
		return err
	}
	f.key = key
	if _, err := f.cfg.Store.MeasureClock(ctx, f.cfg.Clock); err != nil {
		return err
	}
	if f.notes, err = f.cfg.Link.Subscribe(f.own+refusedToken+".>", "", f.refusedElsewhere); err != nil {
		return err
	}
	f.sub, err = f.cfg.Link.Subscribe(f.own+"*.*.*.CONSUMER.>", "", handle)
	return err
}

// Stop stops taking forwarded requests.
func (f *Forwarder) Stop() {
	for _, s := range []*leaf.Subscription{f.sub, f.notes} {
		if s != nil {
			_ = s.Unsubscribe()
		}
	}
}

// now is the time on PostgreSQL's clock, as this replica last measured it.
func (f *Forwarder) now() time.Time { return f.cfg.Store.PGTime(f.cfg.Clock.Now()) }

// Prefix is where the replica called name receives forwarded requests. The name is in hex:
// a replica's default name has dots and colons, which a subject token cannot hold.
func (f *Forwarder) Prefix(name string) string {
	return ForwardPrefix + hex.EncodeToString([]byte(name)) + "."
}

// Forward sends a consumer request that err says another replica serves to that replica,
// with the client's reply subject, so that the replica holding the consumer's state decides
// and answers it exactly as if it had received it, as a JetStream consumer's leader does.
// It returns ErrForwarded then, and otherwise the error to answer with: a request forwarded
// once is never forwarded again (the lock may have moved meanwhile), and one whose replica
// the server does not know of (no cluster, or the owner just died and another holds the
// lock before its row names it) is refused as before.
func (f *Forwarder) Forward(m *leaf.Msg, err error, forwarded bool) error {
	var sb *ServedBy
	if !errors.As(err, &sb) {
		return err
	}
	refuse := server.NewJSConsumerCreateError(ErrServedElsewhere)
	if forwarded || sb.Owner == "" || sb.Owner == f.cfg.ReplicaName {
		return refuse
	}
	api := strings.TrimPrefix(m.Subject, apiPrefix)
	subj := f.Prefix(sb.Owner) + f.Seal(f.now().Unix(), api, m) + "." + api
	if !f.cfg.Link.HasInterest(subj) {
		return refuse
	}
	if e := f.cfg.Link.Publish(subj, m.Reply, m.Header, m.Data); e != nil {
		return refuse
	}
	f.forwards.Inc()
	return ErrForwarded
}

// Seal is the three subject tokens that vouch for a forwarded request: this replica's name
// in hex, when it was sealed, in unix seconds of PostgreSQL's clock, and a MAC with the
// deployment's secret over the name, that time and everything the receiving replica acts on.
func (f *Forwarder) Seal(unix int64, api string, m *leaf.Msg) string {
	return f.sealAs(hex.EncodeToString([]byte(f.cfg.ReplicaName)), strconv.FormatInt(unix, 10), api, m)
}

func (f *Forwarder) sealAs(from, ts, api string, m *leaf.Msg) string {
	return from + "." + ts + "." + f.mac([]byte(from), []byte(ts), []byte(api), []byte(m.Reply), m.Header, m.Data)
}

// mac is the MAC with the deployment's secret over parts, each ended so that no two lists
// of parts run together alike.
func (f *Forwarder) mac(parts ...[]byte) string {
	mac := hmac.New(sha256.New, f.key)
	for _, part := range parts {
		mac.Write(part)
		mac.Write([]byte{0})
	}
	return hex.EncodeToString(mac.Sum(nil)[:16])
}

// Received reports whether m came on this replica's forwarding subjects and, if it did,
// whether its seal holds. A request whose seal holds gets back its $JS.API subject; one
// whose seal does not is logged and counted, to be dropped, and the replica that sealed it
// at a time out of the window is told.
func (f *Forwarder) Received(m *leaf.Msg) (forwarded, ok bool) {
	rest, forwarded := strings.CutPrefix(m.Subject, f.own)
	if !forwarded {
		return false, true
	}
	from, api, sealed, err := f.unseal(rest, m)
	switch {
	case err == nil:
		m.Subject = apiPrefix + api
		return true, true
	case errors.Is(err, errClock):
		now := f.now()
		f.refused.WithLabelValues(RefusedClock, from).Inc()
		f.warnClock.Warn(f.log, f.cfg.Clock.Now(), "refused a consumer request another replica forwarded: its seal's time is too far from this replica's, on PostgreSQL's clock as each measures it",
			"replica", from, "sealed", sealed, "now", now, "apart", now.Sub(sealed), "window", ForwardMaxAge)
		f.tellRefused(from, sealed, now)
		f.answerRefused(api, m.Reply)
	default:
		f.refused.WithLabelValues(RefusedSeal, "").Inc()
		f.warnForged.Warn(f.log, f.cfg.Clock.Now(), "dropped a request on this replica's forwarding subjects that no replica of this deployment sealed",
			"subject", m.Subject, "err", err)
	}
	return true, false
}

var (
	errSeal  = errors.New("no valid seal")
	errClock = errors.New("sealed out of the time window")
)

// unseal checks the seal of a request forwarded here, rest being its subject after the
// forwarding prefix, and returns the replica that sealed it, its subject after "$JS.API."
// and when it was sealed. The MAC is checked first, so that errClock names a replica that
// did seal the request, at a time out of the window.
func (f *Forwarder) unseal(rest string, m *leaf.Msg) (from, api string, sealed time.Time, err error) {
	tok := strings.SplitN(rest, ".", 4)
	if len(tok) < 4 || len(f.key) == 0 {
		return "", "", time.Time{}, errSeal
	}
	name, herr := hex.DecodeString(tok[0])
	unix, terr := strconv.ParseInt(tok[1], 10, 64)
	api = tok[3]
	if herr != nil || terr != nil || !hmac.Equal([]byte(rest[:len(rest)-len(api)-1]), []byte(f.sealAs(tok[0], tok[1], api, m))) {
		return "", "", time.Time{}, errSeal
	}
	sealed = time.Unix(unix, 0)
	if age := f.now().Sub(sealed); age > ForwardMaxAge || age < -ForwardMaxAge {
		return string(name), api, sealed, errClock
	}
	return string(name), api, sealed, nil
}

// answerRefused answers the client of a request refused for its time with
// ErrForwardRefused, in the response type of the request's API, so that it learns at once
// rather than at its timeout. The reply subject is the one the sending replica sealed.
func (f *Forwarder) answerRefused(api, reply string) {
	if reply == "" {
		return
	}
	typ := server.JSApiConsumerCreateResponseType
	switch {
	case strings.HasPrefix(api, "CONSUMER.INFO."):
		typ = server.JSApiConsumerInfoResponseType
	case strings.HasPrefix(api, "CONSUMER.PAUSE."):
		typ = server.JSApiConsumerPauseResponseType
	case strings.HasPrefix(api, "CONSUMER.RESET."):
		typ = server.JSApiConsumerResetResponseType
	}
	data, err := json.Marshal(server.ApiResponse{Type: typ, Error: server.NewJSConsumerCreateError(ErrForwardRefused)})
	if err != nil {
		return
	}
	_ = f.cfg.Link.Publish(reply, "", nil, data)
}

// tellRefused tells the replica called to that this one refused a request it sealed at
// sealed, at now on this replica's measure of PostgreSQL's clock. The notice carries a MAC
// too, and no time window: a replayed one only repeats a warning.
func (f *Forwarder) tellRefused(to string, sealed, now time.Time) {
	from := hex.EncodeToString([]byte(f.cfg.ReplicaName))
	s, n := strconv.FormatInt(sealed.Unix(), 10), strconv.FormatInt(now.Unix(), 10)
	_ = f.cfg.Link.Publish(f.Prefix(to)+refusedToken+"."+from+"."+s+"."+n+"."+f.mac([]byte(refusedToken), []byte(from), []byte(s), []byte(n)), "", nil, nil)
}

// refusedElsewhere takes another replica's notice that it refused a request this one
// forwarded, and says so.
func (f *Forwarder) refusedElsewhere(m *leaf.Msg) {
	tok := strings.Split(strings.TrimPrefix(m.Subject, f.own+refusedToken+"."), ".")
	if len(tok) != 4 || len(f.key) == 0 || !hmac.Equal([]byte(tok[3]), []byte(f.mac([]byte(refusedToken), []byte(tok[0]), []byte(tok[1]), []byte(tok[2])))) {
		return
	}
	name, err := hex.DecodeString(tok[0])
	sealed, serr := strconv.ParseInt(tok[1], 10, 64)
	at, aerr := strconv.ParseInt(tok[2], 10, 64)
	if err != nil || serr != nil || aerr != nil {
		return
	}
	f.refusedThere.WithLabelValues(string(name)).Inc()
	f.warnRefusedThere.Warn(f.log, f.cfg.Clock.Now(), "another replica refused a consumer request this replica forwarded: the two disagree on PostgreSQL's clock by more than the window (a clock jumped since it was last measured against PostgreSQL's, or the request was replayed)",
		"replica", string(name), "sealed", time.Unix(sealed, 0), "refused_at", time.Unix(at, 0), "apart", time.Duration(at-sealed)*time.Second, "window", ForwardMaxAge)
}
