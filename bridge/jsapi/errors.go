package jsapi

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

// API handlers are typed: each returns its own response, never nil, and an error. respond is
// the one place that turns that error into the JetStream error the client receives, and
// apiError the one mapping from what went wrong to a JetStream code:
//
//   - a *server.ApiError is the handler's own verdict (a bad request, a stream that does not
//     exist, ...) and goes out as it is;
//   - a database that is down, slow or timing out (pg.ErrUnavailable, pg.ErrTimeout, a
//     request whose context ended) is "JetStream system temporarily unavailable", 503 with
//     err_code 10008, which clients retry; never "not found", which they treat as final;
//   - any other failure is the database refusing what the request asked: the request's own
//     failure error (a stream create error for a stream create, ...) saying "database error".
//
// "Not found" is a verdict only PostgreSQL's answer may give: a handler turns pg.ErrNotFound
// into the stream's, consumer's or message's own error, and a lookup that could not read the
// database returns the database's error, which maps to 10008 and never to 10014 or 10059.

// failFunc builds a request's own JetStream error for a database failure that was not
// transient, such as server.NewJSStreamCreateError.
type failFunc func(error, ...server.ErrorOption) *server.ApiError

// errDatabase is the description of a database failure that was not transient; the cause
// goes to the log, not to clients.
var errDatabase = errors.New("database error")

// dbTransient reports whether err means the database could not be reached in time, as
// opposed to a database that answered.
func dbTransient(err error) bool {
	return errors.Is(err, pg.ErrUnavailable) || errors.Is(err, pg.ErrTimeout) || errors.Is(err, pg.ErrOwnershipLost) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// apiError maps a handler's error to the JetStream error a client receives; see above.
func apiError(err error, fail failFunc) *server.ApiError {
	var ae *server.ApiError
	switch {
	case errors.As(err, &ae):
		return ae
	case dbTransient(err):
		return server.NewJSClusterNotAvailError()
	default:
		return fail(errDatabase)
	}
}

// respond sends a typed handler's response; head is the response's embedded ApiResponse.
// When err is set, the same response goes out carrying apiError(err, fail), with every other
// field as the handler left it, as nats-server sends its error responses.
func (a *API) respond(reply string, resp any, head *server.ApiResponse, fail failFunc, err error) {
	outcome := "ok"
	if err != nil {
		head.Error = apiError(err, fail)
		outcome = "error"
		switch {
		case head.Error.ErrCode == uint16(server.JSClusterNotAvailErr):
			outcome = "unavailable"
			a.log.Warn("API request failed: database unavailable", "type", head.Type, "err", err)
		case !isAPIError(err):
			a.log.Error("API request failed", "type", head.Type, "err", err)
		}
	}
	data, merr := json.Marshal(resp)
	if merr != nil {
		a.log.Error("encoding API response", "err", merr)
		return
	}
	a.am.reqs.WithLabelValues(outcome).Inc()
	_ = a.link.Publish(reply, "", nil, data)
}

func isAPIError(err error) bool {
	var ae *server.ApiError
	return errors.As(err, &ae)
}

// directFailure is apiError for direct gets, which answer with a bare status line: a
// database that cannot be reached is the 503 a client also hears while no JetStream serves
// the stream, which it retries; any other failure is the database's own 500.
func directFailure(err error) (code int, desc string) {
	if dbTransient(err) {
		return 503, ""
	}
	return 500, "Database Error"
}
