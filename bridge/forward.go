package bridge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/consumer"
	"github.com/jetgres/jetgres/embedded/leaf"
)

const (
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
)

// forwardMetrics count the requests this replica forwards and those it refuses.
type forwardMetrics struct {
	forwards prometheus.Counter
	refused  prometheus.Counter
}

func newForwardMetrics(reg prometheus.Registerer) *forwardMetrics {
	m := &forwardMetrics{
		forwards: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_requests_forwarded_total",
			Help: "Consumer updates, pauses and info requests this replica forwarded to the replica that serves the consumer."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "jetgres_consumer_forwards_refused_total",
			Help: "Requests on this replica's forwarding subjects dropped because their seal was wrong or too old: not sent by a replica."}),
	}
	if reg != nil {
		reg.MustRegister(m.forwards, m.refused)
	}
	return m
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
// lock before its row names it) is refused as before.
func (b *Bridge) forward(m *leaf.Msg, err error, forwarded bool) error {
	var sb *consumer.ServedBy
	if !errors.As(err, &sb) {
		return err
	}
	refuse := server.NewJSConsumerCreateError(consumer.ErrServedElsewhere)
	if forwarded || sb.Owner == "" || sb.Owner == b.cfg.ReplicaName {
		return refuse
	}
	api := strings.TrimPrefix(m.Subject, apiPrefix)
	subj := b.forwardPrefix(sb.Owner) + b.seal(b.clock.Now().Unix(), api, m) + "." + api
	if !b.link.HasInterest(subj) {
		return refuse
	}
	if e := b.link.Publish(subj, m.Reply, m.Header, m.Data); e != nil {
		return refuse
	}
	b.fm.forwards.Inc()
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
