// Package consumer is the consumer engine: the pull and push consumers this replica serves
// and how they behave. One consumer type serves both; pull and push are delivery strategies
// (puller and pusher) chosen when a consumer starts from its configuration. The engine owns
// each consumer's goroutine and queue of events, the registry of served consumers per
// stream, and their delivery: what goes out next, from the tail cache or PostgreSQL. The
// parts with a narrow interface of their own live below it: the ack state machine
// (bridge/consumerstate), the cursor writer (cursor), num_pending's bookkeeping (pending),
// the queue of waiting pull requests (pullqueue) and its priority groups (priority), the
// ticker that finds other replicas' commits (ticker), shared reads (sharedread), the
// read-ahead and its background reads (readahead), start positions (startpos), how a purge
// moves consumers (purgemove), replay pacing (replay), a push consumer's flow control
// (flowctl), the MSG.NEXT subscriptions (nextsub), the info of a consumer from what
// PostgreSQL stores (storedinfo) and the instruments (metrics).
//
// It reaches PostgreSQL through Store, which *pg.DB satisfies, and NATS through Link,
// which *leaf.Conn satisfies; every read behind the tail holds a permit of the pop lane and
// every cursor write one of the ack lane. It takes the streams' events as a
// stream.Subscriber (OnCommitted, OnPurged, OnRemoved, OnDropped) and tells retention of
// acks and consumer changes through Retention. The API handlers, which decode requests and
// build responses, are bridge/jsapi's: they call Create, Info, Pause, Unpin, Reset, Delete
// and List, and HandlePull takes the pull requests that reach this replica through the
// $JS.API queue group. The scheduler (bridge/schedule) takes its streams' locks on the
// engine's ownership session through HoldScheduler.
//
// # Ownership
//
// A consumer is served by the replica whose ownership session holds its advisory lock
// (bridge/ownership, whose loop the engine runs and whose fence stops every consumer at
// once); that replica alone subscribes the consumer's MSG.NEXT subject. The engine takes a
// consumer's lock before it serves it, gives it back when it stops, and serves what the
// loop claims. A request that must reach another replica's consumer is refused with an
// *ownership.ServedBy naming that replica, for the caller to forward it there.
//
// # Locks
//
// In the order in which they may be held together: a goroutine that holds one may take
// only those below it.
//
//  1. Engine.mu guards the map from streams to their consumer registries. Held with it:
//     each registry's mu, to list it. Metrics collection lists consumers under it and
//     reads each after releasing it.
//  2. consumer.mu guards a consumer's state. Its goroutine holds it while it works, except
//     around database reads; API requests, retention and metrics take it briefly. Held with
//     it: its registry's mu (a stopping consumer removes itself), the leaves below and its
//     stream's tail.
//  3. streamConsumers.mu guards one stream's map of consumers.
//  4. bridge/stream's locks, in that package's order, and bridge/retention's leaves, taken
//     when the engine tells retention of an ack or a consumer change.
//  5. Leaves, nothing taken while one is held: consumer.qmu (a consumer's queue of
//     events), Engine.pushMu (the push consumers the interest watcher looks after; a
//     stopping consumer leaves it under its own mu), and the one lock of each of the
//     subpackages that has one (a pending.Tracker, a cursor.Writer, a stream's
//     sharedread.Reads, nextsub.Held).
//
// A tail's lock (bridge/tailcache) is a leaf too. The link's locks (package leaf) and the
// flow lanes' come after all of these: a consumer's goroutine publishes its deliveries and
// answers with its mu held, which is safe because the link's publish only queues into its
// outbound buffer and never waits for the network; it takes permits with its mu released.
// The link calls its handlers with
// none of its own locks held; the link's Subscribe and Unsubscribe of MSG.NEXT run outside
// nextsub's lock. No lock is held across a database call: the goroutine releases its mu
// around reads and counts, and cursor writes run on goroutines of their own. The ownership
// session (pg.Ownership) has its own lock, taken with none of these held: a lock given back
// goes from a goroutine of its own.
package consumer
