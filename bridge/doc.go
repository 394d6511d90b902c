// Package bridge serves JetStream on top of PostgreSQL: it wires together the engines beside
// it, starts them and stops them.
//
// The JetStream API is bridge/jsapi: the router, the handlers and the worker queue. The
// bridge subscribes $JS.API.> and the forwarding subjects to its Serve. bridge/jserr is the
// one mapping from the engines' and package pg's domain errors to what JetStream says: API
// errors, PubAck errors and the status lines of direct gets.
//
// The engines beside it: bridge/stream is the streams (the registry, each stream's intake
// and the append transactions that fuse them, its tail and the events it announces),
// bridge/consumer the pull and push consumers this process serves (their deliveries, acks
// and cursor writes, the ticker), bridge/ownership which replica serves which consumer (the
// session, its locks, the loop that keeps them, the fence, and the forwarding of requests
// to that replica), bridge/gets
// answers gets from memory or with shared reads, bridge/consumerstate is a consumer's ack
// state machine and bridge/tailcache the tail caches. The wire format (ack
// subjects and bodies, pull requests and status lines, headers, PubAcks, configuration
// checks and defaults) is internal/jswire. A stream announces its commits, purges,
// removals and deletion as events that its get index, its tail and the consumer engine
// (a stream.Subscriber) take, in that order, on the goroutine that made the change. The
// consumer engine reaches the streams through the registry and retention through
// consumer.Retention (consumer_wiring.go).
//
// The SQL mover, which brings what applications published with jetgres.publish into their
// streams, is bridge/sqlmove. It reaches the streams and the publish path only through
// sqlHost (sqlmove_wiring.go): it checks a message as a publish is checked, appends it
// under an append permit as a flush does, and announces the commit to the stream.
//
// What a stream's republish sends is bridge/republish, one more stream.Subscriber after the
// consumer engine: it takes the commits this process made and sends them from a queue of its
// own, so that neither the read loop nor the commit waits for it.
//
// Copying into streams with a mirror or sources is bridge/mirror: one engine, which talks
// to every origin through NATS on a link of its own (Config.CopyLink) and to the streams
// only through copyHost (mirror_wiring.go): a mirror's batches are stored as a restore's
// are and announced as one, a source's are appended and announced as a commit. It holds
// none of the locks below when it calls copyHost, whose methods take them as their owners
// do.
//
// Retention is bridge/retention: interest and workqueue retention passes, max_age and
// lowered limits, chunk drops and de-duplication id pruning, and the interest and work
// queue checks. It keeps its own state of each stream and reaches the streams, the
// consumers this process serves and the streams' events only through retentionHost
// (retention_wiring.go); the ack path hands it every ack, and the API handlers tell it of
// consumer changes and settle it before a stream info.
//
// Message schedules are bridge/schedule: one goroutine that, on the replica holding a
// stream's scheduler lock (taken on the consumers' ownership session), reads what the
// stream committed, fires what is due and purges the one-shot schedules that fired. It
// reaches the streams, that lock, appends and purges only through scheduleHost
// (schedule_wiring.go); the intake checks a schedule's headers (bridge/stream).
//
// When package pg finds the database served by another server (a standby promoted), the
// registry rebuilds the streams' tails and get indexes from it and purges what the
// consumers read ahead (stream.Registry.ServerChanged); the streams are re-read, as after a
// lost notification, and the ownership loop is kicked, so that its fence serves the
// consumers again from the positions the new server holds.
//
// The bridge reaches NATS clients through a leafnode link to the embedded server (see
// package leaf): a link handler runs on the link's read loop, so nothing here blocks in one.
// It reaches PostgreSQL only through package pg, and every hot-path database call holds a
// permit of a flow lane first: append for appends, pop for reads behind the tail cache.
//
// # Several replicas
//
// Replicas share one PostgreSQL and one NATS cluster (see bridge/ownership and the
// README's "Several replicas"). Stream subjects and $JS.API.> are queue subscriptions of
// QueueGroup, so each publish is appended and each request answered by one replica; every
// replica appends, serialised by the stream's row lock. A consumer is served by the
// replica whose ownership session (pg.Ownership) holds its advisory lock; that replica
// alone subscribes the consumer's MSG.NEXT subject. A pull request that reaches a replica
// through the queue group is dropped when the replica serves the consumer (its own
// subscription has the request too) or when the server announces another replica's
// subscription to that subject; otherwise the consumer is served nowhere and the replica
// takes it over.
//
// The two races that remain, and why they are harmless:
//   - No answer: a request published after the old server dropped its subscription and
//     before the new one subscribed reaches a replica that either cannot take the lock (the
//     old session is not yet over; it drops the request) or takes it and serves the request.
//     A dropped request ends as the client's pull timeout; its next pull is served.
//   - Double take: between the new server's Subscribe and its noting the subscription, a
//     request that reached it through both subscriptions is queued twice at the consumer.
//     Both are answered by the one serving replica, never by two; the client gets more than
//     it asked, and what it does not acknowledge comes again after ack_wait.
//
// A consumer update, pause or info request that reaches a replica not serving the consumer
// is forwarded to the one that does, on that replica's subject under
// ownership.ForwardPrefix with the client's reply subject, and answered from there, as
// JetStream sends such requests to the consumer's leader. Info is forwarded because only
// that replica knows what it delivered and what waits for an ack; when no replica can be
// asked, info reports what PostgreSQL holds, the ack floor. The other way, writing the
// change to PostgreSQL and letting the server apply it on the notification, would check
// the change against a stored configuration rather than the one in force, let two replicas
// write one consumer's configuration, and answer with what PostgreSQL holds rather than
// the consumer's state; forwarding keeps one writer per consumer and today's checks
// unchanged, at the cost of a hop on a rare request. A request is forwarded once: an
// update or pause that finds the lock moved again is refused. A forwarded request is
// sealed with a MAC over it, its sender and the time (PostgreSQL's, which the replicas
// share where their own clocks may not agree), keyed with a secret every replica reads from
// PostgreSQL, and dropped without it: the forwarding subjects would otherwise let a client
// that may publish anywhere past the server's permissions on $JS.API.
//
// The lock is the one mechanism of ownership: its id-keyed advisory lock, one per
// consumer, says who serves it, and the row's owner column only records the holder. One
// loop (bridge/ownership's Keeper.Run) keeps it: it confirms the session, stops the
// consumers whose rows are gone, and takes over free ones. Takeover spreads: a replica
// takes its fair share of the free consumers per look (pg.Ownership.ClaimFree), the live
// replicas counted by their ownership sessions' shared lock, and one more once free ones
// have been left for a fencing deadline.
//
// Fencing keeps two replicas from serving one consumer: the session is confirmed
// ownership.ClaimsPerLease times per lease, and a failed confirmation, or one older than a
// fifth of the lease, stops every consumer at once, while PostgreSQL frees a silent
// session's locks only after a whole lease and its keepalive probes. A cursor write also
// lands only while the row names this replica as owner.
//
// # Locks
//
// The mutexes the bridge and its engines take together, in the order in which they may be
// held: a goroutine that holds one may take only those below it.
//
//  1. The stream registry's admin lock (bridge/stream, LockAdmin) serialises stream
//     create, update and delete and the re-reading of the streams from PostgreSQL. The API
//     handlers (bridge/jsapi) hold it across database calls, subscriptions and retention passes.
//  2. A retention pass's lock (bridge/retention) lets one pass run on a stream at a time.
//     A pass holds it across database calls, reads the consumers this process serves
//     (bridge/consumer's locks) and announces what it removed, whose subscribers take theirs.
//  3. bridge/consumer's locks, in that package's order: its registry, each consumer, each
//     stream's consumers, then its leaves. Held with them: bridge/stream's other locks (the
//     map of streams, a stream's subscriptions, its intake, the ready queue), in that
//     package's order, and bridge/retention's leaves (the acks noted for a stream's next pass
//     and the filters of the consumers other replicas serve, and the map of them).
//
// A tail's lock (bridge/tailcache) is a leaf, and so are those of bridge/gets (each stream's
// gets.Index and the reads in flight, taken one at a time). The link's locks (package leaf)
// and the flow lanes' come after all of these: the bridge publishes, subscribes and takes
// permits while holding some of them, and the link calls its handlers with none of its own
// locks held. The SQL mover holds none of these when it calls sqlHost, whose methods take
// them as their owners do: re-reading the streams from 1 down, the interest check and a
// commit's announcement from 3 down.
package bridge
