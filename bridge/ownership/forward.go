package ownership

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock"
)

const (
	// ForwardPrefix begins the subjects on which replicas hand each other consumer requests:
	// ForwardPrefix, the replica's name in hex, the seal (two tokens), and the request's
	// subject after "$JS.API.". Clients have no business there; deployments that restrict
	// subjects can deny it to them, and a request a client sends there is dropped all the
	// same, as its seal cannot be right.
	ForwardPrefix = "$JETGRES.REPLICA."
	// ForwardMaxAge is how long a forwarded request's seal holds, either way, for replicas
	// whose clocks disagree a little: a request captured there cannot be replayed later.
	ForwardMaxAge = time.Minute

	apiPrefix = "$JS.API."
)

var (
	// ErrServedElsewhere refuses changes to a consumer whose lock another replica holds,
	// when the request cannot reach that replica.
	ErrServedElsewhere = errors.New("consumer is served by another replica")
	// ErrForwarded says that Forward sent the request on: its answer comes from there.
	ErrForwarded = errors.New("forwarded to the consumer's replica")
)

// ServedBy says that the replica called Owner serves the consumer a request would change:
// the request belongs there (see Forwarder.Forward).
type ServedBy struct{ Owner string }

func (e *ServedBy) Error() string { return ErrServedElsewhere.Error() }

// SecretStore reads the deployment's secret that seals forwarded requests; *pg.DB
// satisfies it.
type SecretStore interface {
	DeploymentSecret(ctx context.Context) ([]byte, error)
}

// ForwarderConfig configures a Forwarder. Every field is required but Registerer.
type ForwarderConfig struct {
	Store SecretStore
	Link  *leaf.Conn
	Clock clock.Clock
	// Registerer receives the forwarder's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// ReplicaName is this replica's name, as other replicas forward to it.
	ReplicaName string
}

// Forwarder sends a consumer request to the replica that serves the consumer, as JetStream
// sends such requests to the consumer's leader, and takes those other replicas send here.
// A forwarded request is sealed with a MAC over it and the time, keyed with the
// deployment's secret, and dropped without it: the forwarding subjects would otherwise let
// a client that may publish anywhere past the server's permissions on $JS.API.
type Forwarder struct {
	cfg ForwarderConfig
	// own is Prefix(cfg.ReplicaName): the subjects of the requests forwarded here.
	own string
	// key is the deployment's secret, read by Start.
	key []byte
	sub *leaf.Subscription

	forwards prometheus.Counter
	refused  prometheus.Counter
}

// NewForwarder builds a Forwarder; Start makes it take forwarded requests.
func NewForwarder(cfg ForwarderConfig) *Forwarder {
	f := &Forwarder{
		cfg: cfg,
		forwards: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_requests_forwarded_total",
			Help: "Consumer updates, pauses and info requests this replica forwarded to the replica that serves the consumer."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_forwards_refused_total",
			Help: "Requests on this replica's forwarding subjects dropped because their seal was wrong or too old: not sent by a replica."}),
	}
	f.own = f.Prefix(cfg.ReplicaName)
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(f.forwards, f.refused)
	}
	return f
}

// Start reads the deployment's secret and subscribes the consumer requests other replicas
// forward here, handing each to handle. It must come before this replica serves any
// consumer: other replicas forward a consumer's requests once its row names this one.
func (f *Forwarder) Start(ctx context.Context, handle leaf.Handler) error {
	key, err := f.cfg.Store.DeploymentSecret(ctx)
	if err != nil {
		return err
	}
	f.key = key
	f.sub, err = f.cfg.Link.Subscribe(f.own+"*.*.CONSUMER.>", "", handle)
	return err
}

// Stop stops taking forwarded requests.
func (f *Forwarder) Stop() {
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
	}
}

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
	subj := f.Prefix(sb.Owner) + f.Seal(f.cfg.Clock.Now().Unix(), api, m) + "." + api
	if !f.cfg.Link.HasInterest(subj) {
		return refuse
	}
	if e := f.cfg.Link.Publish(subj, m.Reply, m.Header, m.Data); e != nil {
		return refuse
	}
	f.forwards.Inc()
	return ErrForwarded
}

// Seal is the two subject tokens that vouch for a forwarded request: when it was sealed, in
// unix seconds, and a MAC with the deployment's secret over that time and everything the
// receiving replica acts on.
func (f *Forwarder) Seal(unix int64, api string, m *leaf.Msg) string {
	ts := strconv.FormatInt(unix, 10)
	mac := hmac.New(sha256.New, f.key)
	for _, part := range [][]byte{[]byte(ts), []byte(api), []byte(m.Reply), m.Header} {
		mac.Write(part)
		mac.Write([]byte{0})
	}
	mac.Write(m.Data)
	return ts + "." + hex.EncodeToString(mac.Sum(nil)[:16])
}

// Received reports whether m came on this replica's forwarding subjects and, if it did,
// whether its seal holds. A request whose seal holds gets back its $JS.API subject; one
// whose seal does not is counted, to be dropped.
func (f *Forwarder) Received(m *leaf.Msg) (forwarded, ok bool) {
	rest, forwarded := strings.CutPrefix(m.Subject, f.own)
	if !forwarded {
		return false, true
	}
	api, ok := f.unseal(rest, m)
	if !ok {
		f.refused.Inc()
		return true, false
	}
	m.Subject = apiPrefix + api
	return true, true
}

// unseal checks the seal of a request forwarded here, rest being its subject after the
// forwarding prefix, and returns its subject after "$JS.API.".
func (f *Forwarder) unseal(rest string, m *leaf.Msg) (api string, ok bool) {
	ts, after, _ := strings.Cut(rest, ".")
	mac, api, _ := strings.Cut(after, ".")
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || api == "" || len(f.key) == 0 {
		return "", false
	}
	if age := f.cfg.Clock.Now().Sub(time.Unix(unix, 0)); age > ForwardMaxAge || age < -ForwardMaxAge {
		return "", false
	}
	return api, hmac.Equal([]byte(ts+"."+mac), []byte(f.Seal(unix, api, m)))
}
