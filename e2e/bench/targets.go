package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// stopTimeout bounds the stop of each component the bench started.
const stopTimeout = 30 * time.Second

// benchTarget is one system under test. NATS targets have a client URL; the naive baseline has a
// queue instead, and its "client" calls a function where the others call nats.go.
type benchTarget struct {
	name  string
	url   string
	naive *pgtest.Naive
	node  *jetgresNode // in-process jetgres, for its lane statistics; nil otherwise
}

// jetgresNode is jetgres started in-process the way `jetgres serve` starts it: a pool,
// the embedded NATS server, the leafnode link and the bridge.
type jetgresNode struct {
	db      *pg.DB
	nats    *natsd.Server
	link    *leaf.Conn
	bridge  *bridge.Bridge
	appends *flow.Lane
	// reg holds the bridge's metrics, from which the report shows where a publish spends
	// its time inside jetgres.
	reg *prometheus.Registry
}

// defaultLanes are the lanes `jetgres serve` makes with its default flags.
func defaultLanes() (push, pop, ack *flow.Lane, err error) {
	if push, err = flow.NewLane("append", flow.Options{Init: flow.AppendInitDefault, Min: flow.AppendMinDefault,
		Max: flow.AppendMaxDefault, Alpha: flow.AppendAlphaDefault, Beta: flow.AppendBetaDefault}); err != nil {
		return nil, nil, nil, err
	}
	if pop, err = flow.NewLane("pop", flow.Options{Init: flow.PopInitDefault, Min: flow.PopMinDefault,
		Max: flow.PopMaxDefault, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault}); err != nil {
		return nil, nil, nil, err
	}
	if ack, err = flow.NewLane("ack", flow.Options{Init: flow.AckInitDefault, Min: flow.AckMinDefault,
		Max: flow.AckMaxDefault, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault}); err != nil {
		return nil, nil, nil, err
	}
	return push, pop, ack, nil
}

// startJetgres starts a node on dsn whose transactions commit with synchronous_commit set to
// commit ("on" or "off", as --synchronous-commit) and whose bridge uses the given lanes.
func startJetgres(ctx context.Context, dsn, commit string, push, pop, ack *flow.Lane, log *slog.Logger) (_ *jetgresNode, err error) {
	n := &jetgresNode{appends: push, reg: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			n.stop()
		}
	}()
	n.db, err = pg.Open(ctx, pg.Config{URL: dsn, MaxConns: PoolSize, SynchronousCommit: commit, Logger: log.With("component", "pg")})
	if err != nil {
		return nil, fmt.Errorf("jetgres: connect to PostgreSQL: %w", err)
	}
	if err := n.db.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("jetgres: migrate schema: %w", err)
	}
	n.nats, err = natsd.Start(ctx, natsd.Config{Host: "127.0.0.1", Port: -1, Logger: log.With("component", "nats")})
	if err != nil {
		return nil, fmt.Errorf("jetgres: NATS server: %w", err)
	}
	ep := n.nats.Leaf()
	n.link, err = leaf.Dial(ctx, leaf.Config{Addr: ep.Addr, User: ep.User, Password: ep.Password,
		Name: "jetgres-bench-bridge", Logger: log.With("component", "leaf")})
	if err != nil {
		return nil, fmt.Errorf("jetgres: leafnode link: %w", err)
	}
	// Each node has its own registry: two nodes live in this process at once.
	n.bridge, err = bridge.New(bridge.Config{DB: n.db, Link: n.link, Append: push, Pop: pop, Ack: ack,
		Logger: log.With("component", "bridge"), Registerer: n.reg,
		ReplicaName: "bench-" + n.nats.ClientURL(), MaxPayload: n.nats.MaxPayload()})
	if err != nil {
		return nil, fmt.Errorf("jetgres: bridge: %w", err)
	}
	if err := n.bridge.Start(ctx); err != nil {
		n.bridge = nil
		return nil, fmt.Errorf("jetgres: start bridge: %w", err)
	}
	return n, nil
}

func (n *jetgresNode) url() string { return n.nats.ClientURL() }

// Bridge histograms the report reads: publish receipt → PubAck sent, the append transaction,
// and the messages per transaction.
const (
	metricPubAck = "jetgres_publish_ack_seconds"
	metricCommit = "jetgres_fusion_commit_seconds"
	metricBatch  = "jetgres_fusion_batch_messages"
)

// histSums is the sum and count of each histogram of a registry at one moment.
type histSums map[string][2]float64

// sums snapshots the target's bridge histograms; empty for a target not run in-process.
func (t *benchTarget) sums() histSums {
	out := histSums{}
	if t.node == nil {
		return out
	}
	mfs, err := t.node.reg.Gather()
	if err != nil {
		return out // a partial gather still has what it could read; missing means "not shown"
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				v := out[mf.GetName()]
				out[mf.GetName()] = [2]float64{v[0] + h.GetSampleSum(), v[1] + float64(h.GetSampleCount())}
			}
		}
	}
	return out
}

// inside condenses what the bridge measured between two snapshots.
func inside(before, after histSums) *Inside {
	mean := func(name string) float64 {
		sum, n := after[name][0]-before[name][0], after[name][1]-before[name][1]
		if n <= 0 {
			return 0
		}
		return sum / n
	}
	in := &Inside{PubAckUs: mean(metricPubAck) * 1e6, CommitUs: mean(metricCommit) * 1e6, BatchMsgs: mean(metricBatch)}
	if in.PubAckUs == 0 && in.CommitUs == 0 {
		return nil
	}
	return in
}

// stop stops whatever start got to, in reverse order, and reports what failed.
func (n *jetgresNode) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var errs []error
	if n.bridge != nil {
		if err := n.bridge.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop bridge: %w", err))
		}
	}
	if n.link != nil {
		if err := n.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close leafnode link: %w", err))
		}
	}
	if n.nats != nil {
		n.nats.Stop()
	}
	if n.db != nil {
		n.db.Close()
	}
	return errors.Join(errs...)
}
