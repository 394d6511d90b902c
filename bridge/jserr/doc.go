// Package jserr is the one mapping from what went wrong to what JetStream says: the engines
// and package pg return domain errors (pg.ErrNotFound, pg.ErrUnavailable, a *pg.LimitError,
// a *server.ApiError verdict, ...), and only this package decides which JetStream error a
// client hears for them, in whichever of the three shapes its request is answered:
//
//   - an API error, the error object of a $JS.API JSON response (code, err_code and
//     description): API, with the request-specific verdicts StreamLookup, StreamCreate,
//     MsgLookup and MsgDelete;
//   - a PubAck error, the same object in a publish's answer: PublishFailed for a transaction
//     that stored nothing, PublishRefused for one message the transaction refused;
//   - an inline status line, a header-only answer such as "404 Message Not Found", for
//     direct gets: Status, DirectLookup and StatusOf.
//
// Two rules hold across all three. A database that could not be reached in time, or cannot
// write until its disk has room (Transient), is an answer clients retry, never "not found",
// which they treat as final. And "not found" is a verdict only PostgreSQL's answer may give:
// only pg.ErrNotFound becomes one here.
//
// Checks of domain errors that decide what an engine does next (retry, skip, log) stay in
// the engines; checks that decide what a client is told live here.
//
// It is a leaf: it imports pg and nats-server's error table, nothing of the bridge, so that
// every package under bridge/ may use it. It has no state.
package jserr
