package jsapi

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/jswire"
)

// unsupportedRequest is one kind of request nats-server serves under $JS.API and jetgres does
// not: its name (the subject's fixed tokens, also the metric's label), how many name tokens
// (stream, consumer, ...) follow, and the response type nats-server answers it with.
type unsupportedRequest struct {
	name string
	args int
	typ  string
}

// unsupportedRequests are nats-server's API subjects (server/jetstream_api.go) that jetgres
// does not serve: the cluster-only ones, which have nothing to do with one PostgreSQL behind
// any number of replicas. The list bounds the label set of jetgres_api_unsupported_total.
var unsupportedRequests = [...]unsupportedRequest{
	{name: "STREAM.LEADER.STEPDOWN", args: 1, typ: server.JSApiStreamLeaderStepDownResponseType},
	{name: "STREAM.PEER.REMOVE", args: 1, typ: server.JSApiStreamRemovePeerResponseType},
	{name: "STREAM.PEER.EVACUATE", args: 1, typ: server.JSApiStreamEvacuatePeerResponseType},
	{name: "STREAM.CANCEL_MOVE", args: 1, typ: server.JSApiStreamCancelMoveResponseType},
	{name: "CONSUMER.LEADER.STEPDOWN", args: 2, typ: server.JSApiConsumerLeaderStepDownResponseType},
	{name: "CONSUMER.PEER.REMOVE", args: 2, typ: server.JSApiConsumerRemovePeerResponseType},
	{name: "CONSUMER.PEER.EVACUATE", args: 2, typ: server.JSApiConsumerEvacuatePeerResponseType},
	{name: "META.LEADER.STEPDOWN", typ: server.JSApiLeaderStepDownResponseType},
	{name: "META.RESCUE", typ: server.JSApiMetaRescueResponseType},
	{name: "SERVER.REMOVE", typ: server.JSApiMetaServerRemoveResponseType},
	{name: "SERVER.EVACUATE", typ: server.JSApiMetaServerEvacuateResponseType},
	{name: "ACCOUNT.PURGE", args: 1, typ: server.JSApiAccountPurgeResponseType},
	{name: "ACCOUNT.STREAM.MOVE", args: 2, typ: server.JSApiStreamUpdateResponseType},
	{name: "ACCOUNT.STREAM.CANCEL_MOVE", args: 2, typ: server.JSApiStreamUpdateResponseType},
}

// findUnsupported reports which unsupported request a subject (after "$JS.API.") is, as an
// index into unsupportedRequests, or -1.
func findUnsupported(rest string) int {
	for i, u := range unsupportedRequests {
		args, ok := strings.CutPrefix(rest, u.name)
		if !ok {
			continue
		}
		if u.args == 0 && args == "" {
			return i
		}
		if u.args > 0 && strings.HasPrefix(args, ".") && strings.Count(args, ".") == u.args {
			return i
		}
	}
	return -1
}

// unsupportedError is the answer to a request jetgres does not serve. JetStream has no error
// for "not implemented"; of its errors, the one that says a feature is not supported where
// the request was sent is "not currently supported in clustered mode" (503, err_code 10036),
// and jetgres, replicas sharing one PostgreSQL, is such a deployment. Its code and err_code
// stay as JetStream defines them, since clients compare those; the description names the
// request, so that whoever reads it knows what jetgres lacks, not which mode it is in.
func unsupportedError(u *unsupportedRequest) *server.ApiError {
	e := *server.NewJSClusterUnSupportFeatureError()
	e.Description = fmt.Sprintf("%s is not supported by jetgres", u.name)
	return &e
}

// answerUnsupported refuses a request jetgres does not serve: logged once per kind, counted
// every time.
func (a *API) answerUnsupported(m *leaf.Msg, i int) {
	u := &unsupportedRequests[i]
	if a.unsupportedLogged[i].CompareAndSwap(false, true) {
		a.log.Warn("JetStream API request not supported (logged once per kind)", "request", u.name, "subject", m.Subject)
	}
	a.am.unsupported.WithLabelValues(u.name).Inc()
	r := jswire.ErrorResponse(u.typ, nil)
	a.respond(m.Reply, r, r, server.NewJSStreamGeneralError, unsupportedError(u))
}

// Unsupported names the requests the API refuses as not supported, as the labels of
// jetgres_api_unsupported_total name them.
func Unsupported() []string {
	names := make([]string, len(unsupportedRequests))
	for i, u := range unsupportedRequests {
		names[i] = u.name
	}
	return names
}
