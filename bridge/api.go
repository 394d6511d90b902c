package bridge

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

const (
	apiPrefix    = "$JS.API."
	apiMsgNext   = "$JS.API.CONSUMER.MSG.NEXT."
	apiDirectGet = "$JS.API.DIRECT.GET."
)

// onAPI runs on the link's read loop. Pull requests take their cheap in-order path, and so
// do direct gets that memory answers; every other request goes to the bounded worker
// queue, and a full queue answers 503 at once.
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
		b.cons.HandlePull(m, stream, consumer)
		return
	}
	if m.Reply == "" {
		return
	}
	if rest, ok := strings.CutPrefix(m.Subject, apiDirectGet); ok && b.directGetFromMemory(m, rest) {
		return
	}
	select {
	case b.apiReqs <- m:
	default:
		b.am.reqs.WithLabelValues("overloaded").Inc()
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
	forwarded, ok := b.fwd.Received(m)
	if !ok {
		return
	}
	rest := strings.TrimPrefix(m.Subject, apiPrefix)
	tok := strings.Split(rest, ".")
	if i := findUnsupported(rest); i >= 0 {
		b.answerUnsupported(m, i)
		return
	}
	switch {
	case rest == "INFO":
		r, err := b.apiAccountInfo(ctx)
		b.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case tok[0] == "STREAM":
		b.streamAPI(ctx, tok[1:], m)
	case tok[0] == "CONSUMER":
		b.handleConsumerAPI(ctx, tok[1:], m, forwarded)
	case len(tok) >= 3 && tok[0] == "DIRECT" && tok[1] == "GET" && tok[2] != "":
		b.directGet(ctx, m, tok[2:])
	default:
		b.badRequest(m, server.JSApiSystemResponseType)
	}
}

// badRequest answers a request jetgres cannot make sense of, as nats-server does.
func (b *Bridge) badRequest(m *leaf.Msg, typ string) {
	r := jswire.ErrorResponse(typ, nil)
	b.respond(m.Reply, r, r, server.NewJSStreamGeneralError, server.NewJSBadRequestError())
}

// requestedStream reads an API request about the stream called name: it decodes body into
// req, or, for subjects that take no request (req nil), refuses any body but an empty one,
// and then finds the stream. Both checks come in the order nats-server makes them.
func (b *Bridge) requestedStream(ctx context.Context, name string, body []byte, req any) (*stream.Stream, error) {
	if req == nil {
		if !jswire.IsEmptyRequest(body) {
			return nil, server.NewJSNotEmptyRequestError()
		}
	} else if e := jswire.DecodeRequest(body, req); e != nil {
		return nil, e
	}
	return b.findStream(ctx, name)
}

// findStream finds the stream called name, answering "stream not found" only when
// PostgreSQL said so; a database it could not read is the database's error.
func (b *Bridge) findStream(ctx context.Context, name string) (*stream.Stream, error) {
	s, err := b.streams.Find(ctx, name)
	return s, notFoundAsStream(err)
}

// notFoundAsStream answers pg.ErrNotFound from a stream lookup as JetStream's "stream not
// found", and any other error as it is.
func notFoundAsStream(err error) error {
	if errors.Is(err, pg.ErrNotFound) {
		return server.NewJSStreamNotFoundError()
	}
	return err
}

func (b *Bridge) apiAccountInfo(ctx context.Context) (*server.JSApiAccountInfoResponse, error) {
	resp := &server.JSApiAccountInfoResponse{ApiResponse: jswire.APIResponse(server.JSApiAccountInfoResponseType)}
	var stats server.JetStreamAccountStats
	stats.API.Level = jswire.APILevel
	// One read for all streams: a read per stream took seconds with thousands of them,
	// beyond the clients' request timeout.
	totals, err := b.db.AllTotals(ctx)
	if err != nil {
		return resp, err
	}
	// Every replica's consumers, in one read too.
	counts, err := b.db.ConsumerCounts(ctx)
	if err != nil {
		return resp, err
	}
	streams := b.streams.List()
	stats.Streams = len(streams)
	for _, s := range streams {
		stats.Consumers += counts[s.ID()]
	}
	// Usage and reservations by storage type ("nats account info" prints the reservations).
	sums := b.streams.SumByStorage(totals, "")
	stats.Memory, stats.Store, stats.ReservedMemory, stats.ReservedStore = sums.Memory, sums.File, sums.ReservedMemory, sums.ReservedFile
	stats.Limits = server.JetStreamAccountLimits{MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1, MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1}
	resp.JetStreamAccountStats = &stats
	return resp, nil
}
