package jsapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/consumer"
	"github.com/jetgres/jetgres/bridge/jserr"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/bridge/retention"
	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/pg"
)

// Store is what the API reads and writes in PostgreSQL; *pg.DB is the one implementation.
type Store interface {
	AllTotals(ctx context.Context) (map[int64]pg.StreamTotals, error)
	ConsumerCounts(ctx context.Context) (map[int64]int, error)
	Consumers(ctx context.Context, streamID int64) ([]pg.Consumer, error)
	CountPending(ctx context.Context, p pg.PendingParams) (uint64, error)
	LastSeqsPerSubject(ctx context.Context, streamID int64, filters []string, upTo uint64) ([]uint64, error)
	SeqAtTime(ctx context.Context, streamID int64, ts int64) (uint64, error)
	CreateStreamChecked(ctx context.Context, name string, config []byte, firstSeq uint64, check pg.StreamCheck) (pg.StreamRow, error)
	UpdateStreamChecked(ctx context.Context, id int64, name string, config []byte, check pg.StreamCheck) error
	DeleteStream(ctx context.Context, id int64) error
	StreamInfo(ctx context.Context, id int64) (pg.InfoState, error)
	SubjectTotals(ctx context.Context, streamID int64, filter string) (map[string]uint64, error)
	DeletedSeqs(ctx context.Context, streamID int64) ([]uint64, error)
	Purge(ctx context.Context, id int64, p pg.PurgeParams) (uint64, error)
	DeleteMessage(ctx context.Context, id int64, seq uint64) error
	// For snapshots and restores.
	State(ctx context.Context, id int64) (pg.StreamState, error)
	ReadFiltered(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, time.Duration, error)
	RestoreMessages(ctx context.Context, p pg.RestoreParams) error
	CreateConsumer(ctx context.Context, c pg.Consumer, maxConsumers int) (pg.Consumer, error)
}

var _ Store = (*pg.DB)(nil)

// Config is what the API serves with. Every field but Registerer is required.
type Config struct {
	Link      *leaf.Conn
	Store     Store
	Streams   *stream.Registry
	Consumers *consumer.Engine
	// Forwarder sends consumer requests to the replica that serves the consumer.
	Forwarder *ownership.Forwarder
	Retention *retention.Enforcer[*stream.Stream]
	Clock     clock.Clock
	Logger    *slog.Logger
	// Registerer receives the API's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// Queue bounds the requests waiting for a worker, and Workers is how many are served at
	// once.
	Queue, Workers int
	// MaxPayload is what streams without a max_msg_size report.
	MaxPayload int32
	// ClusterName and ReplicaName are the cluster and leader that info reports.
	ClusterName, ReplicaName string
	// Domain is the JetStream domain that account and stream info report; "" reports none.
	Domain string
	// Copies reports the mirror and sources blocks of stream info, and hears of streams
	// created or changed with one. Nil refuses mirrors and sources.
	Copies Copies
}

// Copies is the engine that copies into streams with a mirror or sources (bridge/mirror).
type Copies interface {
	Info(s *stream.Stream) (*server.StreamSourceInfo, []*server.StreamSourceInfo)
	Kick()
}

// API serves the JetStream API.
type API struct {
	cfg       Config
	db        Store
	link      *leaf.Conn
	log       *slog.Logger
	am        *apiMetrics
	clock     clock.Clock
	streams   *stream.Registry
	cons      *consumer.Engine
	fwd       *ownership.Forwarder
	retention *retention.Enforcer[*stream.Stream]

	bg startstop.Group
	// ctx is the workers' context, from Start until Stop cancels it.
	ctx     context.Context
	apiReqs chan *leaf.Msg
	// unsupportedLogged[i] is set once unsupportedRequests[i] has been logged.
	unsupportedLogged [len(unsupportedRequests)]atomic.Bool
}

// New builds an API; Start starts its workers, and Serve takes its requests.
func New(cfg Config) *API {
	return &API{
		cfg:       cfg,
		db:        cfg.Store,
		link:      cfg.Link,
		log:       cfg.Logger,
		am:        newAPIMetrics(cfg.Registerer),
		clock:     cfg.Clock,
		streams:   cfg.Streams,
		cons:      cfg.Consumers,
		fwd:       cfg.Forwarder,
		retention: cfg.Retention,
		apiReqs:   make(chan *leaf.Msg, cfg.Queue),
	}
}

// Start starts the workers, which serve until Stop. ctx is not theirs: it bounds nothing
// and only its values pass on.
func (a *API) Start(ctx context.Context) error {
	wctx, err := a.bg.Start(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("jsapi: start: %w", err)
	}
	a.ctx = wctx
	for range a.cfg.Workers {
		a.bg.Go(a.apiWorker)
	}
	return nil
}

// Stop stops the workers and returns once they have; requests still queued go unanswered.
// It is safe before Start.
func (a *API) Stop() { a.bg.Stop() }

// Queued is how many requests wait for a worker.
func (a *API) Queued() int { return len(a.apiReqs) }

const (
	apiPrefix    = "$JS.API."
	apiMsgNext   = "$JS.API.CONSUMER.MSG.NEXT."
	apiDirectGet = "$JS.API.DIRECT.GET."
)

// Serve is the handler of $JS.API.> on the link, and of the requests other replicas
// forward here. It runs on the link's read loop. Pull requests take their cheap in-order
// path, and so do direct gets that memory answers; every other request goes to the bounded
// worker queue, and a full queue answers 503 at once.
func (a *API) Serve(m *leaf.Msg) {
	if rest, ok := strings.CutPrefix(m.Subject, apiMsgNext); ok {
		stream, consumer, ok := strings.Cut(rest, ".")
		if !ok || stream == "" || consumer == "" || strings.Contains(consumer, ".") {
			// nats-server has no subscription for such a subject; jetgres listens on all of
			// $JS.API.>, so it says what is wrong rather than leave the client to time out.
			if m.Reply != "" {
				_ = a.link.Publish(m.Reply, "", jswire.StatusHeader(400, "Bad Request"), nil)
			}
			return
		}
		a.cons.HandlePull(m, stream, consumer)
		return
	}
	if m.Reply == "" {
		return
	}
	if rest, ok := strings.CutPrefix(m.Subject, apiDirectGet); ok && a.directGetFromMemory(m, rest) {
		return
	}
	select {
	case a.apiReqs <- m:
	default:
		a.am.reqs.WithLabelValues("overloaded").Inc()
		_ = a.link.Publish(m.Reply, "", jswire.StatusHeader(503, "API Overloaded"), nil)
	}
}

func (a *API) apiWorker() {
	for {
		select {
		case <-a.ctx.Done():
			return
		case m := <-a.apiReqs:
			a.serveAPI(a.ctx, m)
		}
	}
}

// serveAPI routes one API request by its subject, after the "$JS.API." prefix.
func (a *API) serveAPI(ctx context.Context, m *leaf.Msg) {
	forwarded, ok := a.fwd.Received(m)
	if !ok {
		return
	}
	rest := strings.TrimPrefix(m.Subject, apiPrefix)
	tok := strings.Split(rest, ".")
	if i := findUnsupported(rest); i >= 0 {
		a.answerUnsupported(m, i)
		return
	}
	switch {
	case rest == "INFO":
		r, err := a.apiAccountInfo(ctx)
		a.respond(m.Reply, r, &r.ApiResponse, server.NewJSStreamGeneralError, err)
	case tok[0] == "STREAM":
		a.streamAPI(ctx, tok[1:], m)
	case tok[0] == "CONSUMER":
		a.handleConsumerAPI(ctx, tok[1:], m, forwarded)
	case len(tok) >= 3 && tok[0] == "DIRECT" && tok[1] == "GET" && tok[2] != "":
		a.directGet(ctx, m, tok[2:])
	default:
		a.badRequest(m, server.JSApiSystemResponseType)
	}
}

// badRequest answers a request jetgres cannot make sense of, as nats-server does.
func (a *API) badRequest(m *leaf.Msg, typ string) {
	r := jswire.ErrorResponse(typ, nil)
	a.respond(m.Reply, r, r, server.NewJSStreamGeneralError, server.NewJSBadRequestError())
}

// requestedStream reads an API request about the stream called name: it decodes body into
// req, or, for subjects that take no request (req nil), refuses any body but an empty one,
// and then finds the stream. Both checks come in the order nats-server makes them.
func (a *API) requestedStream(ctx context.Context, name string, body []byte, req any) (*stream.Stream, error) {
	if req == nil {
		if !jswire.IsEmptyRequest(body) {
			return nil, server.NewJSNotEmptyRequestError()
		}
	} else if e := jswire.DecodeRequest(body, req); e != nil {
		return nil, e
	}
	return a.findStream(ctx, name)
}

// findStream finds the stream called name, answering "stream not found" only when
// PostgreSQL said so; a database it could not read is the database's error.
func (a *API) findStream(ctx context.Context, name string) (*stream.Stream, error) {
	s, err := a.streams.Find(ctx, name)
	return s, jserr.StreamLookup(err)
}

func (a *API) apiAccountInfo(ctx context.Context) (*server.JSApiAccountInfoResponse, error) {
	resp := &server.JSApiAccountInfoResponse{ApiResponse: jswire.APIResponse(server.JSApiAccountInfoResponseType)}
	var stats server.JetStreamAccountStats
	stats.API.Level = jswire.APILevel
	stats.Domain = a.cfg.Domain
	// One read for all streams: a read per stream took seconds with thousands of them,
	// beyond the clients' request timeout.
	totals, err := a.db.AllTotals(ctx)
	if err != nil {
		return resp, err
	}
	// Every replica's consumers, in one read too.
	counts, err := a.db.ConsumerCounts(ctx)
	if err != nil {
		return resp, err
	}
	streams := a.streams.List()
	stats.Streams = len(streams)
	for _, s := range streams {
		stats.Consumers += counts[s.ID()]
	}
	// Usage and reservations by storage type ("nats account info" prints the reservations).
	sums := a.streams.SumByStorage(totals, "")
	stats.Memory, stats.Store, stats.ReservedMemory, stats.ReservedStore = sums.Memory, sums.File, sums.ReservedMemory, sums.ReservedFile
	stats.Limits = server.JetStreamAccountLimits{MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1, MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1}
	resp.JetStreamAccountStats = &stats
	return resp, nil
}

// respond sends a typed handler's response; head is the response's embedded ApiResponse.
// When err is set, the same response goes out carrying jserr.API(err, fail), with every other
// field as the handler left it, as nats-server sends its error responses: handlers return
// errors, and this is where they become what a client hears.
func (a *API) respond(reply string, resp any, head *server.ApiResponse, fail jserr.Fail, err error) {
	a.respondHdr(reply, nil, resp, head, fail, err)
}

// respondHdr is respond with headers on the answer.
func (a *API) respondHdr(reply string, hdr []byte, resp any, head *server.ApiResponse, fail jserr.Fail, err error) {
	outcome := "ok"
	if err != nil {
		head.Error = jserr.API(err, fail)
		outcome = "error"
		switch {
		case head.Error.ErrCode == uint16(server.JSClusterNotAvailErr):
			outcome = "unavailable"
			a.log.Warn("API request failed: database unavailable", "type", head.Type, "err", err)
		case !jserr.IsVerdict(err):
			a.log.Error("API request failed", "type", head.Type, "err", err)
		}
	}
	data, merr := json.Marshal(resp)
	if merr != nil {
		a.log.Error("encoding API response", "err", merr)
		return
	}
	a.am.reqs.WithLabelValues(outcome).Inc()
	_ = a.link.Publish(reply, "", hdr, data)
}
