// Package pg is jetgres's only door to PostgreSQL: it owns every SQL statement, the connection
// pool, the embedded schema migrations and the statement timeouts. No other package imports
// pgx, and no pgx type appears in its API; callers use methods on *DB, in pg's own types, and
// test pg's own sentinel errors (ErrTimeout, ErrNotFound, …), never pgx's. Besides pg, only
// the test helpers under pgtest import pgx, to give tests a database and raw SQL of their own.
//
// Three ways to run work, matching the flow control in the design:
//
//   - The hot-path methods (Append, ReadFiltered, WriteCursor) run under the statement timeout
//     and return the round-trip time the caller feeds to its Vegas limiter, measured whether
//     the work succeeded or not. The caller takes its limiter permit before calling, so the
//     order is permit, then connection.
//   - The other methods run maintenance and administration (retention, stream and consumer
//     admin, point reads, metrics queries) without a limiter, under a longer timeout.
//   - Migrate brings the schema up to date at start-up.
//
// When a statement outlives its timeout (or its caller's context ends), pg does not just stop
// waiting: it sends PostgreSQL an out-of-band cancel request so the backend stops executing and
// lets go of its locks, and it destroys the connection instead of returning it to the pool, so
// a late cancel can never hit the next statement run on it.
//
// Message rows are only ever inserted. Each stream's messages live in chunk tables of a fixed
// number of rows (jetgres.msgs_<stream>_<chunk>, listed in jetgres.chunks), and every removal
// (limits, max_age, purge, deletes, interest and workqueue retention) either moves the
// stream's first sequence, which reads respect, or leaves a tombstone in jetgres.deleted; the
// state row counts what is left, so that limits and stream info never count rows. Once the
// first sequence has passed a whole chunk, the maintainer drops its table: the space goes back
// to the operating system at once and no dead tuple is left for VACUUM, which an old snapshot
// (a long transaction, a lagging replica) would otherwise hold back. The chunks are plain
// tables rotated by the append path rather than partitions of one table because of what
// dropping one costs the publish path: dropping or detaching a partition takes an ACCESS
// EXCLUSIVE lock on the parent, which waits behind every running reader and writer of the
// stream and, while it waits, blocks every append queued behind it (DETACH … CONCURRENTLY
// avoids that only by running outside a transaction block and waiting for every transaction
// that may still use the partition). A rotated table that no one appends to any more is
// locked alone, under a short lock_timeout, so only a reader of messages already gone can
// ever wait for it, and a reader whose chunk disappeared treats it as empty. Planning is
// cheaper too: a statement names the one or two chunks it needs instead of leaving the
// planner to prune hundreds of partitions.
package pg
