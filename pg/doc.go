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
// A transaction whose commit was sent and got no answer (the connection broke, the timeout
// fired, the server ended the session) may have committed or not. Append and MoveStaged say
// so with ErrOutcomeUnknown, never run it again, and forget what they remember of its
// streams; Resolve ends the session that ran it and reads back whether each batch is stored.
//
// The replicas share no clock but PostgreSQL's: DB measures how far its replica's clock is
// from it (clock.go), and Append, MoveStaged and ExpireOlder take their times on it, so that
// message times, duplicate windows and max_age agree between replicas whose clocks do not.
//
// A URL of several hosts with target_session_attrs=read-write follows a promotion: each new
// connection takes the first host that accepts writes, and a write that a server refuses as
// read-only drops its connection. Each new connection also reads which server it reached
// (its system identifier and timeline); the first to find another than before forgets what
// pg remembers of every stream and tells OnServerChange each stream's sequences there, before
// anything else runs on it, since an asynchronous standby may lack the last commits. An
// ownership session left on a server the pool has left is lost.
//
// Message rows are only ever inserted. Each stream's messages live in chunks of a number of
// rows its limits choose (ChunkRowsFor; the maintainer also closes the chunks of slow and
// max_age streams, CloseChunks): tables jetgres.msgs_<stream>_<chunk>, listed in jetgres.chunks
// and attached as the partitions [(stream, chunk), (stream, chunk + 1)) of one table,
// jetgres.msgs. Every
// removal (limits, max_age, purge, deletes, interest and workqueue retention) either moves
// the stream's first sequence, which reads respect, or leaves a tombstone in jetgres.deleted;
// the state row counts what is left, so that limits and stream info never count rows. Once
// the first sequence has passed a whole chunk, the maintainer detaches and drops its table:
// the space goes back to the operating system at once and no dead tuple is left for VACUUM,
// which an old snapshot (a long transaction, a lagging replica) would otherwise hold back.
// A message published with a TTL also gets a row in jetgres.msg_ttl (migration 017), in
// the same transaction; Expire finds what is due by that table's expiry index and removes
// it as any out-of-order removal, with a tombstone (ttl.go).
//
// A message can be derived under the row lock from its subject's last live message
// (AppendMsg.Derive: a counter's increment); the last values a process's own commits left
// let the next append take the fast path, guarded by the stream's whole state.
//
// The hot path (publish, read, get) names jetgres.msgs and never a chunk table: its
// statements are prepared once per pooled connection whatever the number of streams and
// chunks, and one INSERT stores the messages of every stream a transaction fuses, which
// PostgreSQL routes to their chunks. Reads and gets name the chunk by its key, so the planner
// opens that partition only. Chunks are attached rather than created as partitions, and
// detached CONCURRENTLY, because the plain forms lock jetgres.msgs against every reader and
// writer of every stream.
//
// A consumer can also be read in SQL, in the application's own transaction
// (jetgres.next, jetgres.ack_through; migration 015): such a consumer has a row in
// jetgres.sql_consumers, which Ownership never claims or keeps, and SQLConsumerState
// reports what its transactions committed.
package pg
