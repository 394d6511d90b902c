package jsapi

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/startpos"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

// serveReset serves CONSUMER.RESET.<stream>.<consumer> with an empty body (back to the ack
// floor) or {"seq":n}. nats-server's consumer subscribes that subject itself, so a request
// for a stream or consumer that does not exist hears no responders, as here; the rest is
// answered as its processResetReq answers. The replica serving the consumer resets it: the
// request is forwarded there.
func (a *API) serveReset(ctx context.Context, m *leaf.Msg, streamName, name string, forwarded bool) {
	resp, err := a.apiReset(ctx, m, streamName, name)
	if err = a.fwd.Forward(m, err, forwarded); err == ownership.ErrForwarded {
		return
	}
	if notFound(err) {
		_ = a.link.Publish(m.Reply, "", jswire.StatusHeader(jserr.NoResponders.Code, ""), nil)
		return
	}
	a.respond(m.Reply, resp, &resp.ApiResponse, server.NewJSStreamGeneralError, err)
}

func (a *API) apiReset(ctx context.Context, m *leaf.Msg, streamName, name string) (*server.JSApiConsumerResetResponse, error) {
	resp := &server.JSApiConsumerResetResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerResetResponseType)}
	s, err := a.findStream(ctx, streamName)
	if err != nil {
		return resp, err
	}
	if v := jswire.HeaderValue(m.Header, server.JSRequiredApiLevel); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n > jswire.APILevel {
			return resp, server.NewJSRequiredApiLevelError()
		}
	}
	var req server.JSApiConsumerResetRequest
	if len(m.Data) > 0 {
		if err := json.Unmarshal(m.Data, &req); err != nil {
			return resp, server.NewJSInvalidJSONError(err)
		}
	}
	info, seq, err := a.cons.Reset(ctx, s, name, req.Seq)
	if errors.Is(err, startpos.ErrBelowStartSeq) || errors.Is(err, startpos.ErrBelowStartTime) || errors.Is(err, startpos.ErrResetNotAllowed) {
		return resp, server.NewJSConsumerInvalidResetError(err)
	}
	if err != nil {
		return resp, err
	}
	resp.ConsumerInfo, resp.ResetSeq = info, seq
	return resp, nil
}

// notFound reports whether err is the API's "stream not found" or "consumer not found".
func notFound(err error) bool {
	var ae *server.ApiError
	return errors.As(err, &ae) && (ae.ErrCode == uint16(server.JSStreamNotFoundErr) || ae.ErrCode == uint16(server.JSConsumerNotFoundErr))
}
