package retention

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// expireLimit bounds the messages one expiry pass over a stream with message TTLs looks
// at, so that a backlog of expiries never makes one long transaction: what is left waits
// for the next maintainPeriod, and jetgres_expiry_bounded_total counts each time it does.
const expireLimit = 10_000

// ttlMetrics count what the TTL expiry passes do.
type ttlMetrics struct {
	expired prometheus.Counter
	markers prometheus.Counter
	bounded prometheus.Counter
}

func newTTLMetrics(reg prometheus.Registerer) ttlMetrics {
	m := ttlMetrics{
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_expired_messages_total",
			Help: "Messages removed by their Nats-TTL or by max_age on streams that allow message TTLs.",
		}),
		markers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_delete_markers_total",
			Help: "Subject delete markers stored where a subject's last message expired.",
		}),
		bounded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetgres_expiry_bounded_total",
			Help: "Expiry passes that stopped at their bound of messages, leaving the rest due for the next pass.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.expired, m.markers, m.bounded)
	}
	return m
}

// expireTTL applies the message TTLs and max_age of s, a stream that allows message TTLs:
// what they make due goes, except a "never" message, which max_age passes over; with
// subject delete markers, a subject's last message that expires is replaced by a marker
// (Host.Mark), whose roll-up takes it, as nats-server does.
func (e *Enforcer[S]) expireTTL(ctx context.Context, s S, cfg *server.StreamConfig, now time.Time) error {
	p := pg.ExpireParams{StreamID: s.ID(), Now: now.UnixNano(), MaxAge: cfg.MaxAge, Limit: expireLimit}
	if cfg.SubjectDeleteMarkerTTL > 0 {
		p.IsMarker = jswire.IsDeleteMarker
	}
	res, err := e.store.Expire(ctx, p)
	if err != nil {
		return err
	}
	if res.More {
		e.ttl.bounded.Inc()
	}
	if res.Removed > 0 {
		e.ttl.expired.Add(float64(res.Removed))
		e.host.Purged(ctx, s, 0, false)
	}
	if len(res.Markers) == 0 {
		return nil
	}
	n, err := e.host.Mark(ctx, s, res.Markers, cfg.SubjectDeleteMarkerTTL)
	e.ttl.markers.Add(float64(n))
	e.ttl.expired.Add(float64(n))
	if err != nil && !errors.Is(err, pg.ErrNotFound) {
		return err
	}
	return nil
}
