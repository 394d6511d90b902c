// Package jsapi serves the JetStream API, the $JS.API subjects, on top of the bridge's
// engines: it routes each request by its subject, checks and decodes it as nats-server
// does, calls the stream registry, the consumer engine, retention and PostgreSQL, and
// answers as nats-server answers. It also refuses, as unsupported, the requests jetgres
// does not serve.
//
// It owns the router, the handlers and the worker queue. Handlers return domain errors
// (pg.ErrNotFound, pg.ErrUnavailable, a *server.ApiError verdict, ...) as the engines and
// package pg give them; package jserr, the one mapping from what went wrong to what
// JetStream says, turns them into err_codes and status lines, in respond and directGet.
// Everything it serves from is handed to it in a Config; it keeps no state of streams or
// consumers.
//
// # Goroutines
//
// Serve runs on the link's read loop, for requests on $JS.API.> and for those other
// replicas forward here: pull requests and the direct gets that memory answers are served
// there, in order and without blocking; every other request waits in a bounded queue for
// one of Config.Workers workers, from Start until Stop, and a full queue answers 503 at
// once.
//
// # Locks
//
// It has no mutex of its own. Stream create, update and delete hold the stream registry's
// admin lock (bridge/stream, LockAdmin) across their database calls, subscriptions and
// retention calls, as the bridge's lock order allows; every other lock is taken inside the
// engines it calls.
package jsapi
