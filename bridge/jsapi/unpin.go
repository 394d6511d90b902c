package jsapi

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumer/priority"
	"github.com/jetgres/jetgres/internal/jswire"
)

// apiUnpin serves CONSUMER.UNPIN.<stream>.<consumer> with {"group":...}: the client pinned
// in that priority group loses its pin, and the next request to take a message gets a new
// one. The pin lives with the replica serving the consumer, where the request is
// forwarded. The checks come in nats-server's order, the body's before the stream's.
func (a *API) apiUnpin(ctx context.Context, streamName, name string, data []byte) (*server.JSApiConsumerUnpinResponse, error) {
	resp := &server.JSApiConsumerUnpinResponse{ApiResponse: jswire.APIResponse(server.JSApiConsumerUnpinResponseType)}
	// An empty body is invalid JSON here, as nats-server decodes it.
	var req server.JSApiConsumerUnpinRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return resp, server.NewJSInvalidJSONError(err)
	}
	switch {
	case req.Group == "":
		return resp, server.NewJSInvalidJSONError(errors.New("consumer group not specified"))
	case !jswire.ValidPriorityGroup(req.Group):
		return resp, server.NewJSConsumerInvalidGroupNameError()
	}
	s, err := a.findStream(ctx, streamName)
	if err != nil {
		return resp, err
	}
	err = a.cons.Unpin(ctx, s, name, req.Group)
	if errors.Is(err, priority.ErrUnknownGroup) {
		return resp, server.NewJSConsumerInvalidPriorityGroupError()
	}
	return resp, err
}
