package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// errServedElsewhere refuses changes to a consumer whose lease another replica holds, when
// the request cannot reach that replica.
var errServedElsewhere = errors.New("consumer is served by another replica")

// servedBy says that the replica called owner serves the consumer a request would change:
// the request goes there (see forward).
type servedBy struct{ owner string }

func (e *servedBy) Error() string { return errServedElsewhere.Error() }

// handleConsumerAPI serves $JS.API.CONSUMER.* (tok is the subject after "CONSUMER.") on an
// API worker; forwarded says another replica sent it here as the consumer's server. MSG.NEXT
// never comes here: it takes the in-order path of handlePullRequest.
func (b *Bridge) handleConsumerAPI(ctx context.Context, tok []string, m *leaf.Msg, forwarded bool) {
	cs := b.cs()
	switch {
	case len(tok) >= 2 && (tok[0] == "CREATE" || tok[0] == "DURABLE" && tok[1] == "CREATE"):
		r, err := cs.apiCreate(ctx, tok, m.Data)
		if err = b.forward(m, err, forwarded); err == errForwarded {
			return
		}
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSConsumerCreateError, err)
	case len(tok) == 3 && tok[0] == "INFO":
		r, err := cs.apiInfo(ctx, tok[1], tok[2], m.Data, func(served error) bool {
			return b.forward(m, served, forwarded) == errForwarded
		})
		if err == errForwarded {
			return
		}
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 3 && tok[0] == "DELETE":
		r, err := cs.apiDelete(ctx, tok[1], tok[2], m.Data)
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 2 && tok[0] == "NAMES":
		r, err := cs.apiNames(ctx, tok[1], m.Data)
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 2 && tok[0] == "LIST":
		r, err := cs.apiList(ctx, tok[1], m.Data)
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 3 && tok[0] == "PAUSE":
		r, err := cs.apiPause(ctx, tok[1], tok[2], m.Data)
		if err = b.forward(m, err, forwarded); err == errForwarded {
			return
		}
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSConsumerCreateError, err)
	default:
		b.badRequest(m, server.JSApiConsumerInfoResponseType)
	}
}

// apiCreate serves CONSUMER.CREATE.<stream>[.<consumer>[.<filter>]] and
// CONSUMER.DURABLE.CREATE.<stream>.<consumer>, with nats-server's rules for names,
// filters in the subject and the create/update action.
func (cs *consumerSide) apiCreate(ctx context.Context, tok []string, data []byte) (*server.JSApiConsumerCreateResponse, error) {
	resp := &server.JSApiConsumerCreateResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerCreateResponseType)}
	fail := func(e error) (*server.JSApiConsumerCreateResponse, error) { return resp, e }
	var req server.CreateConsumerRequest
	if e := jswire.DecodeRequest(data, &req); e != nil {
		return fail(e)
	}
	var streamName, name, filter string
	durableAPI := tok[0] == "DURABLE"
	legacyEphemeral := false
	switch {
	case durableAPI:
		if len(tok) != 4 {
			return fail(server.NewJSConsumerDurableNameNotInSubjectError())
		}
		streamName, name = tok[2], tok[3]
	case len(tok) == 2:
		legacyEphemeral = true
		streamName, name = tok[1], req.Config.Name
	default:
		streamName, name = tok[1], tok[2]
		if len(tok) > 3 {
			filter = strings.Join(tok[3:], ".")
		}
	}
	if streamName != req.Stream {
		return fail(server.NewJSStreamMismatchError())
	}
	if strings.ContainsAny(name, `\/`) {
		return fail(server.NewJSConsumerNameContainsPathSeparatorsError())
	}
	switch {
	case durableAPI:
		if req.Config.Durable == "" {
			return fail(server.NewJSConsumerDurableNameNotSetError())
		}
		if name != req.Config.Durable {
			return fail(server.NewJSConsumerDurableNameNotMatchSubjectError())
		}
		req.Config.Name = name
	case legacyEphemeral:
		if req.Config.Durable != "" {
			return fail(server.NewJSConsumerEphemeralWithDurableNameError())
		}
	default:
		if req.Config.Durable != "" && name != req.Config.Durable {
			return fail(server.NewJSConsumerDurableNameNotMatchSubjectError())
		}
		req.Config.Name = name
	}
	if filter != "" && len(req.Config.FilterSubjects) != 0 {
		return fail(server.NewJSConsumerMultipleFiltersNotAllowedError())
	}
	if filter != "" && req.Config.FilterSubject != filter {
		return fail(server.NewJSConsumerCreateFilterSubjectMismatchError())
	}
	s, err := cs.b.findStream(ctx, streamName)
	if err != nil {
		return fail(err)
	}
	scfg := s.Config()
	cfg, e := jswire.CheckConsumerConfig(req.Config, &scfg)
	if e != nil {
		return fail(e)
	}
	jswire.SetStaticConsumerMetadata(&cfg)
	if cfg.Durable != "" {
		name = cfg.Durable
	}
	if name == "" {
		name = nuid.Next()
		cfg.Name = name
	}
	if !jswire.ValidName(name) {
		return fail(server.NewJSConsumerBadDurableNameError())
	}
	if cfg.Name == "" {
		cfg.Name = name
	}
	if e := cs.b.workQueueConflict(ctx, s, name, &cfg); e != nil {
		return fail(e)
	}

	c, err := cs.ensure(ctx, streamName, name)
	switch {
	case err == nil:
		if e := cs.applyConfig(ctx, c, cfg, req.Action); e != nil {
			return fail(e)
		}
		cs.b.retention.Stale(s)
		info, err := cs.info(ctx, c)
		if err != nil {
			return fail(fmt.Errorf("consumer %q on stream %q: %w", name, streamName, err))
		}
		resp.ConsumerInfo = info
		return resp, nil
	case errors.Is(err, pg.ErrServedElsewhere):
		return fail(cs.servedBy(ctx, s, name))
	case !errors.Is(err, pg.ErrNotFound):
		return fail(fmt.Errorf("looking up consumer %q on stream %q: %w", name, streamName, err))
	}
	if req.Action == server.ActionUpdate {
		return fail(server.NewJSConsumerDoesNotExistError())
	}
	c, err = cs.create(ctx, s, name, cfg)
	if err != nil {
		return fail(err)
	}
	cs.b.retention.Stale(s)
	info, err := cs.createdInfo(ctx, c)
	if err != nil {
		return fail(fmt.Errorf("consumer %q on stream %q: %w", name, streamName, err))
	}
	resp.ConsumerInfo = info
	return resp, nil
}

// applyConfig applies a create request, or a pause, to an existing consumer.
func (cs *consumerSide) applyConfig(ctx context.Context, c *consumer, cfg server.ConsumerConfig, action server.ConsumerAction) error {
	c.mu.Lock()
	old := c.cfg
	c.mu.Unlock()
	same := jswire.SameConsumerConfig(cfg, old)
	if action == server.ActionCreate && !same {
		return server.NewJSConsumerAlreadyExistsError()
	}
	if err := jswire.CheckConsumerUpdate(&old, &cfg, cs.b.link.HasInterest); err != nil {
		return server.NewJSConsumerCreateError(err, server.Unless(err))
	}
	if same {
		return nil
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return server.NewJSConsumerCreateError(err)
	}
	if err := cs.b.db.UpdateConsumerConfig(ctx, c.sc.s.ID(), c.name, raw); err != nil {
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
func (cs *consumerSide) create(ctx context.Context, s *stream.Stream, name string, cfg server.ConsumerConfig) (*consumer, error) {
	start, err := cs.startFor(ctx, s, &cfg)
	if err != nil {
		return nil, fmt.Errorf("choosing the start of consumer %q on stream %q: %w", name, s.Name(), err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, server.NewJSConsumerCreateError(err)
	}
	// The lock comes first: a replica looking for consumers nobody serves must not take one
	// that is being created here.
	own := cs.own.own
	if own == nil {
		return nil, errStopping
	}
	id, err := own.LockNew(ctx, pg.ConsumerKey{StreamID: s.ID(), Name: name})
	if err != nil {
		return nil, fmt.Errorf("creating consumer %q on stream %q: %w", name, s.Name(), err)
	}
	row, err := cs.b.db.CreateConsumer(ctx, pg.Consumer{ID: id, StreamID: s.ID(), Name: name, Config: raw, AckStreamSeq: start.next - 1, Owner: cs.owner},
		s.Config().MaxConsumers)
	if err != nil {
		cs.release(id)
	}
	switch {
	case errors.Is(err, pg.ErrExists):
		return nil, server.NewJSConsumerNameExistError()
	case errors.Is(err, pg.ErrMaxConsumers):
		return nil, server.NewJSMaximumConsumersLimitError()
	case errors.Is(err, pg.ErrNotFound):
		return nil, server.NewJSStreamNotFoundError()
	case err != nil:
		return nil, fmt.Errorf("creating consumer %q on stream %q: %w", name, s.Name(), err)
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

// startFor decides where a new consumer starts, as nats-server's selectStartingSeqNo does.
func (cs *consumerSide) startFor(ctx context.Context, s *stream.Stream, cfg *server.ConsumerConfig) (*startPos, error) {
	db := cs.b.db
	st, err := db.State(ctx, s.ID())
	if err != nil {
		return nil, err
	}
	first, last := st.FirstSeq, st.LastSeq
	filters := jswire.ConsumerFilters(cfg)
	var next uint64
	var pos startPos
	switch cfg.DeliverPolicy {
	case server.DeliverAll:
		next = first
	case server.DeliverLast:
		next = last
		if len(filters) > 0 {
			next = 0
			for _, f := range filters {
				m, err := db.LastBySubject(ctx, s.ID(), f)
				if errors.Is(err, pg.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				next = max(next, m.Seq)
			}
			if next == 0 {
				next = last + 1
			}
		}
	case server.DeliverLastPerSubject:
		seqs, err := db.LastSeqsPerSubject(ctx, s.ID(), filters, last)
		if err != nil {
			return nil, err
		}
		next = last + 1
		if len(seqs) > 0 {
			next = seqs[0]
			pos.skip, pos.resume = seqs, last
		}
	case server.DeliverByStartSequence:
		next = cfg.OptStartSeq
	case server.DeliverByStartTime:
		next, err = db.SeqAtTime(ctx, s.ID(), cfg.OptStartTime.UnixNano())
		if err != nil {
			return nil, err
		}
	default:
		next = last + 1
	}
	if cfg.OptStartSeq == 0 {
		switch {
		case last == 0:
			next = 1
		case next > last:
			next = last + 1
		}
	}
	next = max(next, first, 1)
	pos.next = next
	return &pos, nil
}

// info reports a consumer as ConsumerInfo. num_pending is counted in PostgreSQL, up to its
// high-water mark rather than the tail's, which other replicas' commits pass until a tick.
func (cs *consumerSide) info(ctx context.Context, c *consumer) (*server.ConsumerInfo, error) {
	c.mu.Lock()
	info, from, extra := cs.infoLocked(c)
	filters := c.filters()
	c.mu.Unlock()
	info.PushBound = cs.pushBound(info.Config)
	hw, err := cs.highWater(ctx, c.sc.s)
	if err != nil {
		return nil, err
	}
	np, err := cs.b.db.CountPending(ctx, pg.PendingParams{StreamID: c.sc.s.ID(), From: from, UpTo: hw, Filters: filters})
	if err != nil {
		return nil, err
	}
	info.NumPending = np + extra
	return info, nil
}

// infoLocked reports what c's state holds, all but num_pending and push_bound, and where
// num_pending counts from. c.mu is held.
func (cs *consumerSide) infoLocked(c *consumer) (info *server.ConsumerInfo, from, extra uint64) {
	now := cs.b.clock.Now()
	cfg := c.cfg
	d, f := c.st.Shown()
	info = &server.ConsumerInfo{
		Stream:         c.sc.s.Name(),
		Name:           c.name,
		Created:        c.created.UTC(),
		Config:         jswire.ConsumerConfigForResponse(&cfg),
		Delivered:      server.SequenceInfo{Consumer: d.Consumer, Stream: d.Stream, Last: utcOrNil(c.st.LastDelivered())},
		AckFloor:       server.SequenceInfo{Consumer: f.Consumer, Stream: f.Stream, Last: utcOrNil(c.st.LastAcked())},
		NumAckPending:  c.st.NumAckPending(),
		NumRedelivered: c.st.NumRedelivered(),
		TimeStamp:      now.UTC(),
		Cluster:        cs.b.clusterInfo(cs.owner),
	}
	info.Paused, info.PauseRemaining = pausedAt(cfg.PauseUntil, now)
	info.NumWaiting = c.out.numWaiting(now)
	from, extra = c.countFrom()
	return info, from, extra
}

// createdInfo reports a consumer create just made: its info as of creation if it is still
// there to take, the current one otherwise (a create that found the consumer existing).
func (cs *consumerSide) createdInfo(ctx context.Context, c *consumer) (*server.ConsumerInfo, error) {
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
func (cs *consumerSide) highWater(ctx context.Context, s *stream.Stream) (uint64, error) {
	hw, err := cs.b.db.HighWater(ctx, []int64{s.ID()})
	return hw[s.ID()], err
}

// rowInfo reports a consumer this process does not serve, from its stored row; hw is the
// stream's high-water mark, read once however many rows a listing reports.
func (cs *consumerSide) rowInfo(ctx context.Context, s *stream.Stream, row pg.Consumer, hw uint64) (*server.ConsumerInfo, error) {
	var cfg server.ConsumerConfig
	if err := json.Unmarshal(row.Config, &cfg); err != nil {
		return nil, err
	}
	np, err := cs.b.db.CountPending(ctx, pg.PendingParams{StreamID: s.ID(), From: row.AckStreamSeq + 1, UpTo: hw, Filters: jswire.ConsumerFilters(&cfg)})
	if err != nil {
		return nil, err
	}
	now := cs.b.clock.Now()
	floor := server.SequenceInfo{Consumer: row.AckConsumerSeq, Stream: row.ShownStreamSeq}
	info := &server.ConsumerInfo{Stream: s.Name(), Name: row.Name, Created: row.Created.UTC(), Config: jswire.ConsumerConfigForResponse(&cfg),
		Delivered: floor, AckFloor: floor, NumPending: np, TimeStamp: now.UTC(), PushBound: cs.pushBound(&cfg)}
	info.Paused, info.PauseRemaining = pausedAt(cfg.PauseUntil, now)
	info.Cluster = cs.b.clusterInfo(row.Owner)
	return info, nil
}

// pushBound reports a push consumer's push_bound as nats-server does: true while a client
// subscribes to exactly its deliver subject, in its deliver group if it has one, as the
// link hears it from the embedded server.
func (cs *consumerSide) pushBound(cfg *server.ConsumerConfig) bool {
	return cfg.DeliverSubject != "" && cs.b.link.HasQueueInterest(cfg.DeliverSubject, cfg.DeliverGroup)
}

// pausedAt reports whether pause_until holds deliveries back at now, and for how long yet.
func pausedAt(until *time.Time, now time.Time) (paused bool, remaining time.Duration) {
	if until == nil || !now.Before(*until) {
		return false, 0
	}
	return true, until.Sub(now)
}

func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// apiInfo serves CONSUMER.INFO.<stream>.<consumer>. forward sends the request on to the
// replica that serves the consumer, when there is one to reach, and reports whether it did.
func (cs *consumerSide) apiInfo(ctx context.Context, streamName, name string, data []byte, forward func(served error) bool) (*server.JSApiConsumerInfoResponse, error) {
	resp := &server.JSApiConsumerInfoResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerInfoResponseType)}
	s, err := cs.b.requestedStream(ctx, streamName, data, nil)
	if err != nil {
		return resp, err
	}
	c, err := cs.ensure(ctx, streamName, name)
	var info *server.ConsumerInfo
	switch {
	case err == nil:
		info, err = cs.info(ctx, c)
	case errors.Is(err, pg.ErrNotFound):
		return resp, server.NewJSConsumerNotFoundError()
	case errors.Is(err, pg.ErrServedElsewhere):
		// The replica that serves the consumer knows what it delivered and what waits for
		// an ack; PostgreSQL holds only the ack floor, which is the answer when no replica
		// can be asked.
		if forward(cs.servedBy(ctx, s, name)) {
			return resp, errForwarded
		}
		var row pg.Consumer
		var hw uint64
		if row, err = cs.b.db.GetConsumer(ctx, s.ID(), name); err == nil {
			if hw, err = cs.highWater(ctx, s); err == nil {
				info, err = cs.rowInfo(ctx, s, row, hw)
			}
		}
	}
	if err != nil {
		return resp, fmt.Errorf("consumer %q on stream %q: %w", name, streamName, err)
	}
	resp.ConsumerInfo = info
	return resp, nil
}

// apiPause serves CONSUMER.PAUSE.<stream>.<consumer>: pause_until in the future stops
// deliveries until then (pull requests still queue, expire and get heartbeats); a time in
// the past or none resumes at once. It is the consumer's pause_until, stored with its config.
func (cs *consumerSide) apiPause(ctx context.Context, streamName, name string, data []byte) (*server.JSApiConsumerPauseResponse, error) {
	resp := &server.JSApiConsumerPauseResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerPauseResponseType)}
	var req server.JSApiConsumerPauseRequest
	s, err := cs.b.requestedStream(ctx, streamName, data, &req)
	if err != nil {
		return resp, err
	}
	c, err := cs.ensure(ctx, streamName, name)
	switch {
	case errors.Is(err, pg.ErrNotFound):
		return resp, server.NewJSConsumerNotFoundError()
	case errors.Is(err, pg.ErrServedElsewhere):
		return resp, cs.servedBy(ctx, s, name)
	case err != nil:
		return resp, fmt.Errorf("looking up consumer %q on stream %q: %w", name, streamName, err)
	}
	c.mu.Lock()
	cfg := c.cfg
	c.mu.Unlock()
	until := req.PauseUntil.UTC()
	cfg.PauseUntil = nil
	if !until.IsZero() {
		cfg.PauseUntil = &until
	}
	jswire.SetStaticConsumerMetadata(&cfg)
	if err := cs.applyConfig(ctx, c, cfg, server.ActionUpdate); err != nil {
		return resp, err
	}
	resp.PauseUntil = until
	resp.Paused, resp.PauseRemaining = pausedAt(&until, cs.b.clock.Now())
	return resp, nil
}

func (cs *consumerSide) apiDelete(ctx context.Context, streamName, name string, data []byte) (*server.JSApiConsumerDeleteResponse, error) {
	resp := &server.JSApiConsumerDeleteResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerDeleteResponseType)}
	s, err := cs.b.requestedStream(ctx, streamName, data, nil)
	if err != nil {
		return resp, err
	}
	err = pg.ErrNotFound
	if jswire.ValidName(name) {
		err = cs.b.db.DeleteConsumer(ctx, s.ID(), name)
	}
	switch {
	case errors.Is(err, pg.ErrNotFound):
		return resp, server.NewJSConsumerNotFoundError()
	case err != nil:
		return resp, fmt.Errorf("deleting consumer %q on stream %q: %w", name, streamName, err)
	}
	if c := cs.find(streamName, name); c != nil {
		cs.remove(c)
		c.stop(stopDeleted)
	}
	cs.b.retention.ConsumerDeleted(ctx, s)
	resp.Success = true
	return resp, nil
}

// pagedConsumers reads a stream's stored consumers and the requested offset.
func (cs *consumerSide) pagedConsumers(ctx context.Context, streamName string, data []byte) (*stream.Stream, []pg.Consumer, int, error) {
	var req server.JSApiConsumersRequest
	s, err := cs.b.requestedStream(ctx, streamName, data, &req)
	if err != nil {
		return nil, nil, 0, err
	}
	rows, err := cs.b.db.Consumers(ctx, s.ID())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("listing consumers of stream %q: %w", streamName, err)
	}
	return s, rows, min(max(req.Offset, 0), len(rows)), nil
}

func (cs *consumerSide) apiNames(ctx context.Context, streamName string, data []byte) (*server.JSApiConsumerNamesResponse, error) {
	resp := &server.JSApiConsumerNamesResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerNamesResponseType), Consumers: []string{}}
	_, rows, offset, err := cs.pagedConsumers(ctx, streamName, data)
	if err != nil {
		return resp, err
	}
	for _, r := range rows[offset:] {
		if len(resp.Consumers) >= server.JSApiNamesLimit {
			break
		}
		resp.Consumers = append(resp.Consumers, r.Name)
	}
	resp.Total, resp.Offset, resp.Limit = len(rows), offset, server.JSApiNamesLimit
	return resp, nil
}

func (cs *consumerSide) apiList(ctx context.Context, streamName string, data []byte) (*server.JSApiConsumerListResponse, error) {
	resp := &server.JSApiConsumerListResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerListResponseType), Consumers: []*server.ConsumerInfo{}}
	s, rows, offset, err := cs.pagedConsumers(ctx, streamName, data)
	if err != nil {
		return resp, err
	}
	hw := uint64(0)
	hwRead := false
	for _, r := range rows[offset:] {
		if len(resp.Consumers) >= server.JSApiListLimit {
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
			return resp, fmt.Errorf("consumer %q on stream %q: %w", r.Name, streamName, err)
		}
		resp.Consumers = append(resp.Consumers, info)
	}
	resp.Total, resp.Offset, resp.Limit = len(rows), offset, server.JSApiListLimit
	return resp, nil
}
