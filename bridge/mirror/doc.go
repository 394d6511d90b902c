// Package mirror owns the copying into streams that have a `mirror` or `sources`: it
// creates, on each origin, the consumer nats-server creates for the same purpose, takes
// what it delivers, and stores it. A mirror keeps the origin's sequences and store times
// (sequences the origin skipped become deleted ones); a source appends with the stream's
// own sequences and the Nats-Stream-Source header, as nats-server formats it.
//
// One engine serves every origin, a stream of this deployment or one of another NATS
// system, and always through NATS, as nats-server does: the origin's API ($JS.API, or the
// `external.api` prefix, $JS.<domain>.API across a leafnode remote) answers the consumer
// create, and the consumer delivers to an inbox the engine subscribes. The engine talks
// through a link of its own (Config.Link): the server never hands a link the messages it
// sent itself, and a stream of this replica answers its API through the bridge's link.
//
// The consumer is nats-server's sourcing consumer: ephemeral, push, ack none, flow control
// and a one-second idle heartbeat, starting after the last sequence the stream holds from
// that origin. The engine answers flow control once what came before the request is
// stored, so the origin never runs further ahead than its window. A heartbeat that names
// a delivery the engine did not see, a delivery out of order, silence for longer than the
// health interval, or a failure to store, makes it create the consumer again, from what is
// stored, after nats-server's back-off.
//
// A mirror's batch lands after the stream's last sequence, and is announced to the
// stream's readers as a commit (stream.Registry.Copied): its consumers keep what they read
// ahead and are woken as for a publish, the sequences it skipped are known not to be
// missed. Only what the copy cannot vouch for (sequences skipped with no message, a batch
// another replica stored) is announced as a restore, which sends the readers back to
// PostgreSQL.
//
// One replica copies into a stream: the one whose lock session (pg.DB.OpenCopyLocks) holds
// the stream's copy lock. The engine confirms the session and stops every copy at once
// when it cannot, within a fifth of the lease, as the consumers' ownership fences. Two
// replicas copying at once would still store nothing twice into a mirror: its messages
// are stored under their origin sequences, and one at or below the stream's last is
// refused.
//
// Stream info may reach any replica: one that does not copy into the stream asks the one
// that does, on InfoPrefix, what it knows of the origins.
//
// Lock order: Engine.mu; a stream copy's resumeMu; an origin's mu. Engine.mu and an
// origin's mu are never held across a database statement or a wait; resumeMu is held while
// the sources' positions are read from the stream, and only that stream's origins wait
// for it.
package mirror
