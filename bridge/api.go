package bridge

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

const (
	apiPrefix  = "$JS.API."
	apiMsgNext = "$JS.API.CONSUMER.MSG.NEXT."
	// apiLevel is the JetStream API level jetgres reports; clients gate features on it.
	apiLevel = 1
)

// onAPI runs on the link's read loop. Pull requests take their cheap in-order path; every
// other request goes to the bounded worker queue, and a full queue answers 503 at once.
func (b *Bridge) onAPI(m *leaf.Msg) {
	if rest, ok := strings.CutPrefix(m.Subject, apiMsgNext); ok {
		stream, consumer, ok := strings.Cut(rest, ".")
		if !ok || stream == "" || consumer == "" || strings.Contains(consumer, ".") {
			// nats-server has no subscription for such a subject; jetgres listens on all of
			// $JS.API.>, so it says what is wrong rather than leave the client to time out.
			if m.Reply != "" {
				_ = b.link.Publish(m.Reply, "", jswire.StatusHeader(400, "Bad Request"), nil)
			}
			return
		}
		b.handlePullRequest(m, stream, consumer)
		return
	}
	if m.Reply == "" {
		return
	}
	select {
	case b.apiReqs <- m:
	default:
		b.pm.apiReqs.WithLabelValues("overloaded").Inc()
		_ = b.link.Publish(m.Reply, "", jswire.StatusHeader(503, "API Overloaded"), nil)
	}
}

func (b *Bridge) apiWorker() {
	for {
		select {
		case <-b.ctx.Done():
			return
		case m := <-b.apiReqs:
			b.serveAPI(b.ctx, m)
		}
	}
}

// serveAPI routes one API request by its subject, after the "$JS.API." prefix.
func (b *Bridge) serveAPI(ctx context.Context, m *leaf.Msg) {
	rest := strings.TrimPrefix(m.Subject, apiPrefix)
	tok := strings.Split(rest, ".")
	var resp any
	switch {
	case rest == "INFO":
		resp = b.apiAccountInfo(ctx)
	case tok[0] == "STREAM":
		resp = b.streamAPI(ctx, tok[1:], m.Data)
	case tok[0] == "CONSUMER":
		resp = b.handleConsumerAPI(ctx, tok[1:], m)
	case len(tok) >= 3 && tok[0] == "DIRECT" && tok[1] == "GET" && tok[2] != "":
		b.directGet(ctx, m, tok[2:])
		return
	default:
		resp = jswire.ErrorResponse(server.JSApiSystemResponseType, server.NewJSBadRequestError())
	}
	if resp == nil {
		return
	}
	b.respond(m.Reply, resp)
}

// respond marshals an API response and sends it, counting errors.
func (b *Bridge) respond(reply string, resp any) {
	data, err := json.Marshal(resp)
	if err != nil {
		b.log.Error("encoding API response", "err", err)
		return
	}
	outcome := "ok"
	if r, ok := resp.(interface{ ToError() error }); ok && r.ToError() != nil {
		outcome = "error"
	}
	b.pm.apiReqs.WithLabelValues(outcome).Inc()
	_ = b.link.Publish(reply, "", nil, data)
}

// requestedStream reads an API request about the stream called name: it decodes body into
// req, or, for subjects that take no request (req nil), refuses any body but an empty one,
// and then finds the stream. Both checks come in the order nats-server makes them.
func (b *Bridge) requestedStream(ctx context.Context, name string, body []byte, req any) (*stream, *server.ApiError) {
	if req == nil {
		if !jswire.IsEmptyRequest(body) {
			return nil, server.NewJSNotEmptyRequestError()
		}
	} else if e := jswire.DecodeRequest(body, req); e != nil {
		return nil, e
	}
	s := b.lookupOrSync(ctx, name)
	if s == nil {
		return nil, server.NewJSStreamNotFoundError()
	}
	return s, nil
}

func (b *Bridge) apiAccountInfo(ctx context.Context) any {
	var stats server.JetStreamAccountStats
	stats.API.Level = apiLevel
	for _, s := range b.streamList() {
		stats.Streams++
		stats.Consumers += b.numConsumers(s)
		if st, err := b.db.State(ctx, s.id); err == nil {
			stats.Store += st.Bytes
		}
	}
	stats.Limits = server.JetStreamAccountLimits{MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1, MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1}
	return &server.JSApiAccountInfoResponse{ApiResponse: jswire.APIResponse(server.JSApiAccountInfoResponseType), JetStreamAccountStats: &stats}
}
