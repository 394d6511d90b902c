package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/nextsub"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg"
)

// hold subscribes the consumer's own MSG.NEXT subject (see bridge/consumer/nextsub).
func (cs *Engine) hold(c *consumer) {
	ref := nextsub.Ref{Stream: c.sc.s.Name(), Consumer: c.name}
	sub, err := cs.link.Subscribe(ref.Subject(), "", func(m *leaf.Msg) { cs.servePull(m, ref.Stream, ref.Consumer) })
	if err != nil {
		cs.log.Warn("subscribing a consumer's pull requests failed", "stream", ref.Stream, "consumer", ref.Consumer, "err", err)
		return
	}
	if old := cs.held.Put(ref, c, sub); old != nil {
		_ = old.Unsubscribe()
	}
}

// unhold drops the consumer's MSG.NEXT subscription and gives its lock back, so that another
// replica may serve it.
func (cs *Engine) unhold(c *consumer) {
	sub := cs.held.Drop(nextsub.Ref{Stream: c.sc.s.Name(), Consumer: c.name}, c)
	if sub == nil {
		return
	}
	_ = sub.Unsubscribe()
	cs.keeper.ReleaseLater(c.id)
}

// stopDeleted stops serving the consumers whose rows are gone.
func (cs *Engine) stopDeleted(gone []pg.Claim) {
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
		// Only the consumer of that id: one created again under its name has a row.
		if c := cs.served(s, k.Name); c != nil && c.id == k.ID {
			c.stop(stopDeleted)
		}
	}
}

// stopAll stops serving every consumer, for the fence, and reports how many it stopped.
func (cs *Engine) stopAll() int {
	all := cs.all()
	for _, c := range all {
		c.stop(stopLost)
	}
	return len(all)
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

// serveClaimed serves a consumer the ownership loop claimed; one left unserved because the
// engine is stopping is no failure.
func (cs *Engine) serveClaimed(ctx context.Context, s *stream.Stream, name string, id int64) error {
	if _, err := cs.serveLocked(ctx, s, name, id); err != nil && !errors.Is(err, errStopping) {
		return err
	}
	return nil
}

// serveLocked starts serving a consumer whose lock this replica has just taken: it records
// this replica as its owner, loads it and starts it. Whatever fails gives the lock back.
func (cs *Engine) serveLocked(ctx context.Context, s *stream.Stream, name string, id int64) (*consumer, error) {
	if c := cs.served(s, name); c != nil {
		// Served here already, or still stopping after a fence: the lock counted twice.
		cs.release(id)
		return c, nil
	}
	row, prev, err := cs.db.SetOwner(ctx, id, cs.owner)
	if err != nil {
		cs.release(id)
		return nil, err
	}
	if prev != "" && prev != cs.owner {
		cs.held.TookOver()
		cs.log.Info("took a consumer over", "stream", s.Name(), "consumer", name, "from", prev)
	}
	sc, err := cs.streamLoaded(ctx, s)
	if err != nil {
		cs.release(id)
		return nil, err
	}
	return cs.activate(ctx, sc, row, nil)
}

// servedBy names the replica whose row says it serves a consumer that another session
// holds the lock of.
func (cs *Engine) servedBy(ctx context.Context, s *stream.Stream, name string) error {
	row, err := cs.db.GetConsumer(ctx, s.ID(), name)
	if err != nil {
		// Deleted since its lock was found held (not found), or which replica serves it is
		// unknown: the database's answer, never a claim that another replica serves it.
		return fmt.Errorf("looking up the replica serving consumer %q on stream %q: %w", name, s.Name(), jserr.ConsumerLookup(err))
	}
	return &ownership.ServedBy{Owner: row.Owner}
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
