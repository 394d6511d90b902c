package pg

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// cancelGrace bounds the cancel request and, as a fallback, the wait for the server to answer
// it. A healthy server answers a cancel in about a millisecond; after the grace the socket's
// deadline fires and pgx closes the connection without the server's answer.
const cancelGrace = 2 * time.Second

// serverCancel is the ctxwatch.Handler of every pooled connection. pgx's default handler only
// sets a deadline on the socket: the call returns, but the backend keeps running the statement
// and holding its locks. This one sends PostgreSQL a cancel request on a fresh connection
// (pgx negotiates the same TLS mode as the pooled one) and keeps reading, so that when the call
// returns the server has normally stopped the statement already. It sends the cancel
// synchronously in the context's AfterFunc goroutine, and pgx's Unwatch waits for that, so no
// cancel is still in flight once the call has returned.
//
// fired marks the connection: a cancel request may reach the backend after the statement it
// was meant for has finished and cancel the next one, so a connection that sent one is never
// used again (see DB.release and the pool's PrepareConn).
type serverCancel struct {
	conn  *pgconn.PgConn
	fired atomic.Bool
}

// cancelKey is where a connection's serverCancel lives in pgconn's CustomData.
const cancelKey = "jetgres.serverCancel"

func newServerCancel(conn *pgconn.PgConn) ctxwatch.Handler {
	h := &serverCancel{conn: conn}
	conn.CustomData()[cancelKey] = h
	return h
}

func (h *serverCancel) HandleCancel(context.Context) {
	h.fired.Store(true)
	deadline := time.Now().Add(cancelGrace)
	_ = h.conn.Conn().SetDeadline(deadline)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	// A failed cancel request leaves the socket deadline to end the call; the connection is
	// then closed by pgx and destroyed by us, which is all the caller needs.
	_ = h.conn.CancelRequest(ctx)
}

func (h *serverCancel) HandleUnwatchAfterCancel() {
	_ = h.conn.Conn().SetDeadline(time.Time{})
}

// cancelSent reports whether a cancel request was sent on conn.
func cancelSent(conn *pgx.Conn) bool {
	h, ok := conn.PgConn().CustomData()[cancelKey].(*serverCancel)
	return ok && h.fired.Load()
}
