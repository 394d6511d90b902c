package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/priority"
	"github.com/jetgres/jetgres/bridge/consumer/startpos"
	"github.com/jetgres/jetgres/bridge/consumer/storedinfo"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// Create applies a create request whose configuration the API checked to the consumer
// called name on s: it updates the consumer when this process serves it and action allows,
// creates it when it does not exist, and reports it as ConsumerInfo. A consumer another
// replica serves is refused with an *ownership.ServedBy.
func (cs *Engine) Create(ctx context.Context, s *stream.Stream, name string, cfg server.ConsumerConfig, action server.ConsumerAction) (*server.ConsumerInfo, error) {
	streamName := s.Name()
	c, err := cs.ensure(ctx, streamName, name)
	switch {
	case err == nil:
		if e := cs.applyConfig(ctx, c, cfg, action); e != nil {
			return nil, e
		}
		cs.cfg.Retention.Stale(s)
		info, err := cs.info(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("consumer %q on stream %q: %w", name, streamName, err)
		}
		return info, nil
	case errors.Is(err, pg.ErrServedElsewhere):
		return nil, cs.servedBy(ctx, s, name)
	case !errors.Is(err, pg.ErrNotFound):
		return nil, fmt.Errorf("looking up consumer %q on stream %q: %w", name, streamName, err)
	}
	if action == server.ActionUpdate {
		return nil, server.NewJSConsumerDoesNotExistError()
	}
	c, err = cs.create(ctx, s, name, cfg)
	if err != nil {
		return nil, err
	}
	cs.cfg.Retention.Stale(s)
	info, err := cs.createdInfo(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("consumer %q on stream %q: %w", name, streamName, err)
	}
	return info, nil
}

// applyConfig applies a create request, or a pause, to an existing consumer.
func (cs *Engine) applyConfig(ctx context.Context, c *consumer, cfg server.ConsumerConfig, action server.ConsumerAction) error {
	c.mu.Lock()
	old := c.cfg
	c.mu.Unlock()
	same := jswire.SameConsumerConfig(cfg, old)
	if action == server.ActionCreate && !same {
		return server.NewJSConsumerAlreadyExistsError()
	}
	if err := jswire.CheckConsumerUpdate(&old, &cfg, cs.link.HasInterest); err != nil {
		return server.NewJSConsumerCreateError(err, server.Unless(err))
	}
	if same {
		return nil
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return server.NewJSConsumerCreateError(err)
	}
	if err := cs.db.UpdateConsumerConfig(ctx, c.sc.s.ID(), c.name, raw); err != nil {
		return fmt.Errorf("updating consumer %q on stream %q: %w", c.name, c.sc.s.Name(), err)
	}
	// The goroutine alone writes the configuration; the answer reports it once in force.
	ch := &configChange{cfg: cfg, applied: make(chan struct{})}
	if !c.postControl(event{kind: evConfig, cfg: ch}) {
		return nil // stopping: whoever serves it next reads the stored configuration
	}
	select {
	case <-ch.applied:
		return nil
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// create stores a new consumer at the start position its deliver policy selects and
// starts serving it.
func (cs *Engine) create(ctx context.Context, s *stream.Stream, name string, cfg server.ConsumerConfig) (*consumer, error) {
	start, err := startpos.Choose(ctx, cs.db, s.ID(), &cfg)
	if err != nil {
		return nil, fmt.Errorf("choosing the start of consumer %q on stream %q: %w", name, s.Name(), err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, server.NewJSConsumerCreateError(err)
	}
	// The lock comes first: a replica looking for consumers nobody serves must not take one
	// that is being created here.
	if !cs.keeper.Opened() {
		return nil, errStopping
	}
	id, err := cs.keeper.LockNew(ctx, pg.ConsumerKey{StreamID: s.ID(), Name: name})
	if err != nil {
		return nil, fmt.Errorf("creating consumer %q on stream %q: %w", name, s.Name(), err)
	}
	row, err := cs.db.CreateConsumer(ctx, pg.Consumer{ID: id, StreamID: s.ID(), Name: name, Config: raw, AckStreamSeq: start.Next - 1, Owner: cs.owner},
		s.Config().MaxConsumers)
	if err != nil {
		cs.release(id)
	}
	if err != nil {
		return nil, fmt.Errorf("creating consumer %q on stream %q: %w", name, s.Name(), jserr.ConsumerCreate(err))
	}
	sc, err := cs.streamLoaded(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("loading stream %q: %w", s.Name(), err)
	}
	c, err := cs.activate(ctx, sc, row, start)
	if err != nil {
		return nil, fmt.Errorf("starting consumer %q on stream %q: %w", name, s.Name(), err)
	}
	return c, nil
}

// info reports a consumer as ConsumerInfo. num_pending is counted in PostgreSQL, up to its
// high-water mark rather than the tail's, which other replicas' commits pass until a tick.
func (cs *Engine) info(ctx context.Context, c *consumer) (*server.ConsumerInfo, error) {
	c.mu.Lock()
	info, from, extra := cs.infoLocked(c)
	filters := c.filters()
	c.mu.Unlock()
	info.PushBound = cs.pushBound(info.Config)
	hw, err := cs.highWater(ctx, c.sc.s)
	if err != nil {
		return nil, err
	}
	np, err := cs.db.CountPending(ctx, pg.PendingParams{StreamID: c.sc.s.ID(), From: from, UpTo: hw, Filters: filters})
	if err != nil {
		return nil, err
	}
	info.NumPending = np + extra
	return info, nil
}

// infoLocked reports what c's state holds, all but num_pending and push_bound, and where
// num_pending counts from. c.mu is held.
func (cs *Engine) infoLocked(c *consumer) (info *server.ConsumerInfo, from, extra uint64) {
	now := cs.clock.Now()
	cfg := c.cfg
	d, f := c.st.Shown()
	info = &server.ConsumerInfo{
		Stream:         c.sc.s.Name(),
		Name:           c.name,
		Created:        c.created.UTC(),
		Config:         jswire.ConsumerConfigForResponse(&cfg),
		Delivered:      server.SequenceInfo{Consumer: d.Consumer, Stream: d.Stream, Last: storedinfo.UTCOrNil(c.st.LastDelivered())},
		AckFloor:       server.SequenceInfo{Consumer: f.Consumer, Stream: f.Stream, Last: storedinfo.UTCOrNil(c.st.LastAcked())},
		NumAckPending:  c.st.NumAckPending(),
		NumRedelivered: c.st.NumRedelivered(),
		TimeStamp:      now.UTC(),
		Cluster:        cs.clusterInfo(cs.owner),
	}
	info.Paused, info.PauseRemaining = storedinfo.PausedAt(cfg.PauseUntil, now)
	info.NumWaiting = c.out.numWaiting(now)
	if p, ok := c.out.(*puller); ok {
		info.PriorityGroups = p.q.PriorityGroups(&cfg, now)
	}
	from, extra = c.countFrom()
	return info, from, extra
}

// createdInfo reports a consumer create just made: its info as of creation if it is still
// there to take, the current one otherwise (a create that found the consumer existing).
func (cs *Engine) createdInfo(ctx context.Context, c *consumer) (*server.ConsumerInfo, error) {
	c.mu.Lock()
	info := c.initial
	c.initial = nil
	c.mu.Unlock()
	if info != nil {
		return info, nil
	}
	return cs.info(ctx, c)
}

// highWater reads a stream's committed high-water mark from PostgreSQL.
func (cs *Engine) highWater(ctx context.Context, s *stream.Stream) (uint64, error) {
	hw, err := cs.db.HighWater(ctx, []int64{s.ID()})
	return hw[s.ID()], err
}

// rowInfo reports a consumer this process does not serve, from its stored row; hw is the
// stream's high-water mark, read once however many rows a listing reports.
func (cs *Engine) rowInfo(ctx context.Context, s *stream.Stream, row pg.Consumer, hw uint64) (*server.ConsumerInfo, error) {
	info, err := storedinfo.Info(ctx, cs.db, s.ID(), s.Name(), row, hw, cs.clock.Now())
	if err != nil {
		return nil, err
	}
	info.PushBound = cs.pushBound(info.Config)
	info.Cluster = cs.clusterInfo(row.Owner)
	return info, nil
}

// pushBound reports a push consumer's push_bound as nats-server does: true while a client
// subscribes to exactly its deliver subject, in its deliver group if it has one, as the
// link hears it from the embedded server.
func (cs *Engine) pushBound(cfg *server.ConsumerConfig) bool {
	return cfg.DeliverSubject != "" && cs.link.HasQueueInterest(cfg.DeliverSubject, cfg.DeliverGroup)
}

// Info reports the consumer called name on s. When another replica serves it, forward is
// given the reason (an *ownership.ServedBy, or why that replica is unknown) and may send
// the request there: Info then reports forwarded and nothing else. Otherwise, since only the serving
// replica knows what it delivered and what waits for an ack, Info reports what PostgreSQL
// holds, the ack floor.
func (cs *Engine) Info(ctx context.Context, s *stream.Stream, name string, forward func(served error) bool) (info *server.ConsumerInfo, forwarded bool, err error) {
	streamName := s.Name()
	c, err := cs.ensure(ctx, streamName, name)
	switch {
	case err == nil:
		info, err = cs.info(ctx, c)
	case errors.Is(err, pg.ErrServedElsewhere):
		if forward(cs.servedBy(ctx, s, name)) {
			return nil, true, nil
		}
		var row pg.Consumer
		var hw uint64
		if row, err = cs.db.GetConsumer(ctx, s.ID(), name); err == nil {
			if hw, err = cs.highWater(ctx, s); err == nil {
				info, err = cs.rowInfo(ctx, s, row, hw)
			}
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("consumer %q on stream %q: %w", name, streamName, jserr.ConsumerLookup(err))
	}
	return info, false, nil
}

// Pause sets the pause_until of the consumer called name on s: a time in the future stops
// deliveries until then (pull requests still queue, expire and get heartbeats); a zero
// time, or one in the past, resumes at once. A consumer another replica serves is refused
// with an *ownership.ServedBy.
func (cs *Engine) Pause(ctx context.Context, s *stream.Stream, name string, until time.Time) error {
	c, err := cs.serveHere(ctx, s, name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	cfg := c.cfg
	c.mu.Unlock()
	cfg.PauseUntil = nil
	if !until.IsZero() {
		cfg.PauseUntil = &until
	}
	jswire.SetStaticConsumerMetadata(&cfg)
	return cs.applyConfig(ctx, c, cfg, server.ActionUpdate)
}

// Unpin takes the pin of the consumer called name on s away from the client holding it,
// as CONSUMER.UNPIN does; group must be one of its priority groups (priority.ErrUnknownGroup). A
// consumer another replica serves is refused with an *ownership.ServedBy.
func (cs *Engine) Unpin(ctx context.Context, s *stream.Stream, name, group string) error {
	c, err := cs.serveHere(ctx, s, name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.out.(*puller); ok && slices.Contains(c.cfg.PriorityGroups, group) {
		p.q.Unpin()
		c.signal()
		return nil
	}
	return priority.ErrUnknownGroup
}

// Reset moves the consumer called name on s as CONSUMER.RESET does (seq 0: back to its
// ack floor; see startpos.Reset): what it delivered and saw no ack for is forgotten and goes
// out again from the reset point, whose floor is stored. It reports the consumer's info as
// nats-server's answer does, and the reset point. A refused reset is one of startpos's
// reasons; a consumer another replica serves is refused with an *ownership.ServedBy.
func (cs *Engine) Reset(ctx context.Context, s *stream.Stream, name string, seq uint64) (*server.ConsumerInfo, uint64, error) {
	c, err := cs.serveHere(ctx, s, name)
	if err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	cfg := c.cfg
	_, floor := c.st.Shown()
	c.mu.Unlock()
	seq, start, err := startpos.Reset(ctx, cs.db, s.ID(), &cfg, floor.Stream, seq)
	if err != nil {
		return nil, 0, err
	}
	ch := &configChange{resetSeq: seq, start: start, applied: make(chan struct{})}
	if !c.postControl(event{kind: evReset, cfg: ch}) {
		return nil, 0, errStopping
	}
	select {
	case <-ch.applied:
	case <-c.done:
		return nil, 0, errStopping
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	cs.cfg.Retention.Stale(s)
	info, err := cs.info(ctx, c)
	if err != nil {
		return nil, 0, fmt.Errorf("consumer %q on stream %q: %w", name, s.Name(), err)
	}
	// Delivery resumes before the info is read: nats-server reports the reset point.
	info.Delivered = server.SequenceInfo{Stream: seq - 1}
	info.AckFloor = server.SequenceInfo{Stream: seq - 1}
	return info, seq, nil
}

// serveHere is the consumer called name on s, served by this replica, or why not: an
// *ownership.ServedBy when another replica serves it.
func (cs *Engine) serveHere(ctx context.Context, s *stream.Stream, name string) (*consumer, error) {
	c, err := cs.ensure(ctx, s.Name(), name)
	switch {
	case errors.Is(err, pg.ErrServedElsewhere):
		return nil, cs.servedBy(ctx, s, name)
	case err != nil:
		return nil, fmt.Errorf("looking up consumer %q on stream %q: %w", name, s.Name(), jserr.ConsumerLookup(err))
	}
	return c, nil
}

// Delete deletes the consumer called name on s, stops serving it if this process does,
// and tells retention.
func (cs *Engine) Delete(ctx context.Context, s *stream.Stream, name string) error {
	streamName := s.Name()
	err := pg.ErrNotFound
	if jswire.ValidName(name) {
		err = cs.db.DeleteConsumer(ctx, s.ID(), name)
	}
	if err != nil {
		return fmt.Errorf("deleting consumer %q on stream %q: %w", name, streamName, jserr.ConsumerLookup(err))
	}
	if c := cs.find(streamName, name); c != nil {
		cs.remove(c)
		c.stop(stopDeleted)
	}
	cs.cfg.Retention.ConsumerDeleted(ctx, s)
	return nil
}

// List reports up to limit of s's stored consumers, in the order of rows, as ConsumerInfo:
// those this process serves from their state, the others from their rows. Rows deleted
// since they were read are left out.
func (cs *Engine) List(ctx context.Context, s *stream.Stream, rows []pg.Consumer, limit int) ([]*server.ConsumerInfo, error) {
	out := []*server.ConsumerInfo{}
	hw := uint64(0)
	hwRead := false
	for _, r := range rows {
		if len(out) >= limit {
			break
		}
		var info *server.ConsumerInfo
		var err error
		if c := cs.served(s, r.Name); c != nil {
			info, err = cs.info(ctx, c)
		} else {
			if !hwRead {
				hw, err = cs.highWater(ctx, s)
				hwRead = err == nil
			}
			if err == nil {
				info, err = cs.rowInfo(ctx, s, r, hw)
			}
		}
		switch {
		case errors.Is(err, pg.ErrNotFound):
			// Deleted since the list was read: not missing, gone.
			continue
		case err != nil:
			// "Missing" would tell the client the consumer could not be found; the
			// database's failure is the answer.
			return out, fmt.Errorf("consumer %q on stream %q: %w", r.Name, s.Name(), err)
		}
		out = append(out, info)
	}
	return out, nil
}

// HighWater reads a stream's committed high-water mark from PostgreSQL.
func (cs *Engine) HighWater(ctx context.Context, s *stream.Stream) (uint64, error) {
	return cs.highWater(ctx, s)
}

// HoldScheduler reports whether this replica fires the message schedules of the stream
// streamID, on the ownership session that holds its consumers (ownership.Keeper).
func (cs *Engine) HoldScheduler(ctx context.Context, streamID int64) (bool, error) {
	return cs.keeper.HoldScheduler(ctx, streamID)
}

// ReleaseScheduler gives up the role HoldScheduler took for a stream that was deleted.
func (cs *Engine) ReleaseScheduler(ctx context.Context, streamID int64) error {
	return cs.keeper.ReleaseScheduler(ctx, streamID)
}
