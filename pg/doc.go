// Package pg is jetgres's only door to PostgreSQL: it owns every SQL statement, the connection
// pool, the embedded schema migrations and the statement timeouts. No other package imports
// pgx; they call methods on *DB and test pg's own sentinel errors (ErrTimeout, ErrNotFound, …),
// never pgx's.
//
// Three ways to run work, matching the flow control in the design:
//
//   - Hot and HotTx run hot-path work (appends, range reads, cursor writes) under the statement
//     timeout and return the round-trip time the caller feeds to its Vegas limiter, measured
//     whether the work succeeded or not. The caller takes its limiter permit before calling,
//     so the order is permit, then connection.
//   - Background and BackgroundTx run maintenance and administration (retention, stream and
//     consumer admin, metrics queries) without a limiter, under a longer timeout.
//   - Migrate brings the schema up to date at start-up.
//
// When a statement outlives its timeout (or its caller's context ends), pg does not just stop
// waiting: it sends PostgreSQL an out-of-band cancel request so the backend stops executing and
// lets go of its locks, and it destroys the connection instead of returning it to the pool, so
// a late cancel can never hit the next statement run on it.
package pg
