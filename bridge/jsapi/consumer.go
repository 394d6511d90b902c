package jsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nuid"

	"github.com/jetgres/jetgres/bridge/consumer/storedinfo"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// handleConsumerAPI serves $JS.API.CONSUMER.* (tok is the subject after "CONSUMER.") on an
// API worker; forwarded says another replica sent it here as the consumer's server. MSG.NEXT
// never comes here: it takes the in-order path of consumer.Engine.HandlePull.
func (a *API) handleConsumerAPI(ctx context.Context, tok []string, m *leaf.Msg, forwarded bool) {
	switch {
	case len(tok) >= 2 && (tok[0] == "CREATE" || tok[0] == "DURABLE" && tok[1] == "CREATE"):
		if e := a.checkCopyingCreate(tok, m.Header); e != nil {
			r := &server.JSApiConsumerCreateResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerCreateResponseType)}
			a.respond(m.Reply, r, &r.ApiResponse, server.NewJSConsumerCreateError, e)
			return
		}
		r, err := a.apiCreate(ctx, tok, m.Data)
		if err = a.fwd.Forward(m, err, forwarded); err == ownership.ErrForwarded {
			return
		}
		a.respondHdr(m.Reply, a.identityHeader(r), r, &r.ApiResponse, server.NewJSConsumerCreateError, err)
	case len(tok) == 3 && tok[0] == "INFO":
		r, err := a.apiInfo(ctx, tok[1], tok[2], m.Data, func(served error) bool {
			return a.fwd.Forward(m, served, forwarded) == ownership.ErrForwarded
		})
		if err == ownership.ErrForwarded {
			return
		}
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 3 && tok[0] == "DELETE":
		r, err := a.apiDelete(ctx, tok[1], tok[2], m.Data)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 2 && tok[0] == "NAMES":
		r, err := a.apiNames(ctx, tok[1], m.Data)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 2 && tok[0] == "LIST":
		r, err := a.apiList(ctx, tok[1], m.Data)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 3 && tok[0] == "PAUSE":
		r, err := a.apiPause(ctx, tok[1], tok[2], m.Data)
		if err = a.fwd.Forward(m, err, forwarded); err == ownership.ErrForwarded {
			return
		}
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSConsumerCreateError, err)
	case len(tok) == 3 && tok[0] == "UNPIN":
		r, err := a.apiUnpin(ctx, tok[1], tok[2], m.Data)
		if err = a.fwd.Forward(m, err, forwarded); err == ownership.ErrForwarded {
			return
		}
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case len(tok) == 3 && tok[0] == "RESET":
		a.serveReset(ctx, m, tok[1], tok[2], forwarded)
	default:
		a.badRequest(m, server.JSApiConsumerInfoResponseType)
	}
}

// apiCreate serves CONSUMER.CREATE.<stream>[.<consumer>[.<filter>]] and
// CONSUMER.DURABLE.CREATE.<stream>.<consumer>, with nats-server's rules for names,
// filters in the subject and the create/update action.
func (a *API) apiCreate(ctx context.Context, tok []string, data []byte) (*server.JSApiConsumerCreateResponse, error) {
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
	s, err := a.findStream(ctx, streamName)
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
	if e := a.workQueueConflict(ctx, s, name, &cfg); e != nil {
		return fail(e)
	}

	info, err := a.cons.Create(ctx, s, name, cfg, req.Action)
	if err != nil {
		return fail(err)
	}
	resp.ConsumerInfo = info
	return resp, nil
}

// apiInfo serves CONSUMER.INFO.<stream>.<consumer>. forward sends the request on to the
// replica that serves the consumer, when there is one to reach, and reports whether it did.
func (a *API) apiInfo(ctx context.Context, streamName, name string, data []byte, forward func(served error) bool) (*server.JSApiConsumerInfoResponse, error) {
	resp := &server.JSApiConsumerInfoResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerInfoResponseType)}
	s, err := a.requestedStream(ctx, streamName, data, nil)
	if err != nil {
		return resp, err
	}
	info, forwarded, err := a.cons.Info(ctx, s, name, forward)
	if forwarded {
		return resp, ownership.ErrForwarded
	}
	if err != nil {
		return resp, err
	}
	resp.ConsumerInfo = info
	return resp, nil
}

// apiPause serves CONSUMER.PAUSE.<stream>.<consumer>: pause_until in the future stops
// deliveries until then (pull requests still queue, expire and get heartbeats); a time in
// the past or none resumes at once. It is the consumer's pause_until, stored with its config.
func (a *API) apiPause(ctx context.Context, streamName, name string, data []byte) (*server.JSApiConsumerPauseResponse, error) {
	resp := &server.JSApiConsumerPauseResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerPauseResponseType)}
	var req server.JSApiConsumerPauseRequest
	s, err := a.requestedStream(ctx, streamName, data, &req)
	if err != nil {
		return resp, err
	}
	until := req.PauseUntil.UTC()
	if err := a.cons.Pause(ctx, s, name, until); err != nil {
		return resp, err
	}
	resp.PauseUntil = until
	resp.Paused, resp.PauseRemaining = storedinfo.PausedAt(&until, a.clock.Now())
	return resp, nil
}

func (a *API) apiDelete(ctx context.Context, streamName, name string, data []byte) (*server.JSApiConsumerDeleteResponse, error) {
	resp := &server.JSApiConsumerDeleteResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerDeleteResponseType)}
	s, err := a.requestedStream(ctx, streamName, data, nil)
	if err != nil {
		return resp, err
	}
	if err := a.cons.Delete(ctx, s, name); err != nil {
		return resp, err
	}
	resp.Success = true
	return resp, nil
}

// pagedConsumers reads a stream's stored consumers and the requested offset.
func (a *API) pagedConsumers(ctx context.Context, streamName string, data []byte) (*stream.Stream, []pg.Consumer, int, error) {
	var req server.JSApiConsumersRequest
	s, err := a.requestedStream(ctx, streamName, data, &req)
	if err != nil {
		return nil, nil, 0, err
	}
	rows, err := a.db.Consumers(ctx, s.ID())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("listing consumers of stream %q: %w", streamName, err)
	}
	// As nats-server, the direct consumers of streams copying from this one are not listed.
	rows = slices.DeleteFunc(rows, func(c pg.Consumer) bool {
		var cfg struct {
			Direct bool `json:"direct"`
		}
		return json.Unmarshal(c.Config, &cfg) == nil && cfg.Direct
	})
	return s, rows, min(max(req.Offset, 0), len(rows)), nil
}

func (a *API) apiNames(ctx context.Context, streamName string, data []byte) (*server.JSApiConsumerNamesResponse, error) {
	resp := &server.JSApiConsumerNamesResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerNamesResponseType), Consumers: []string{}}
	_, rows, offset, err := a.pagedConsumers(ctx, streamName, data)
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

func (a *API) apiList(ctx context.Context, streamName string, data []byte) (*server.JSApiConsumerListResponse, error) {
	resp := &server.JSApiConsumerListResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerListResponseType), Consumers: []*server.ConsumerInfo{}}
	s, rows, offset, err := a.pagedConsumers(ctx, streamName, data)
	if err != nil {
		return resp, err
	}
	if resp.Consumers, err = a.cons.List(ctx, s, rows[offset:], server.JSApiListLimit); err != nil {
		return resp, err
	}
	resp.Total, resp.Offset, resp.Limit = len(rows), offset, server.JSApiListLimit
	return resp, nil
}

// workQueueConflict is retention's check of a consumer on a workqueue stream, answered as
// the API answers it.
func (a *API) workQueueConflict(ctx context.Context, s *stream.Stream, name string, cfg *server.ConsumerConfig) *server.ApiError {
	refused, err := a.retention.WorkQueueConflict(ctx, s, name, cfg)
	if err != nil {
		a.log.Error("listing consumers", "stream", s.Name(), "err", err)
		return jserr.API(err, server.NewJSConsumerCreateError)
	}
	return refused
}

// checkCopyingCreate applies to a consumer create (tok after "CONSUMER.") the headers a
// stream copying from this one sends, as nats-server does: a request that needs a later API
// level than jetgres serves (Nats-Required-Api-Level) is refused, and the copying stream
// asks again for a consumer of the level served; one that expects another stream than the
// one of that name now (Nats-Stream-Identity: the origin was deleted and created again) is
// refused, and a source starts again from the new stream's start.
func (a *API) checkCopyingCreate(tok []string, hdr []byte) *server.ApiError {
	if v := jswire.HeaderValue(hdr, server.JSRequiredApiLevel); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n > jswire.APILevel {
			return server.NewJSRequiredApiLevelError()
		}
	}
	want := jswire.HeaderValue(hdr, server.JSStreamIdentity)
	if want == "" {
		return nil
	}
	name := tok[1]
	if tok[0] == "DURABLE" && len(tok) > 2 {
		name = tok[2]
	}
	if s := a.streams.Lookup(name); s != nil {
		if id := jswire.StreamIdentity(s.Created()); id != want {
			return server.NewJSConsumerStreamIdentityMismatchError(id)
		}
	}
	return nil
}

// identityHeader is the Nats-Stream-Identity header nats-server puts on its answer to the
// create of a direct consumer, which a stream copying from this one names its origin by:
// the stream's identity, from its creation time. Nil for any other answer.
func (a *API) identityHeader(r *server.JSApiConsumerCreateResponse) []byte {
	if r.ConsumerInfo == nil || r.ConsumerInfo.Config == nil || !r.ConsumerInfo.Config.Direct {
		return nil
	}
	s := a.streams.Lookup(r.ConsumerInfo.Stream)
	if s == nil {
		return nil
	}
	return jswire.AppendHeaders(nil, server.JSStreamIdentity, jswire.StreamIdentity(s.Created()))
}
