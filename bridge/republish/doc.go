// Package republish owns what a stream's `republish` sends: once a message is stored, a copy
// of it (or, with headers_only, its headers alone) goes to the subject the republish
// mapping gives its stored subject, with the headers nats-server adds (Nats-Stream,
// Nats-Subject, Nats-Sequence, Nats-Time-Stamp, Nats-Last-Sequence and, with headers_only,
// Nats-Msg-Size).
//
// The Republisher is a stream.Subscriber: it takes each commit this process made, after it
// committed, and never blocks the goroutine that announces it. A commit's messages wait in
// a queue bounded in bytes (Config.QueueBytes; what does not fit is dropped and counted),
// and one goroutine sends them in the order the commits were announced, so a stream's
// messages go out in sequence order. They leave through the bridge's link, which never
// waits either: a message its outbound buffer cannot take is dropped and counted. A message
// names the queue groups the server announced for its destination, as the server hands a
// leafnode's message to no other; when no other replica has the streams' group there, a
// stream of this process whose subjects cover the destination takes it as a publish
// (stream.Registry.PublishLocal), since the server never hands the link its own message.
//
// Nats-Last-Sequence is the sequence of the previous message of the same subject. The
// goroutine keeps it per subject for the streams it republishes, from the commits it sees;
// when a commit does not follow the last one it saw (another replica stored messages in
// between), or a purge may have taken some, or a subject is new to it, it reads it from
// PostgreSQL, one statement per commit.
//
// What is sent is at most once, as with nats-server, which republishes a message once, when
// its leader stores it, from memory: only the replica that committed a message republishes
// it, nothing is republished again after a restart, and what waits in the queue when the
// process dies is lost.
package republish
