// Package leaf owns the bridge's link to the embedded NATS server: a client
// of the server's leafnode port that speaks the leafnode protocol (INFO,
// CONNECT, LS+/LS-, LMSG/HMSG, PING/PONG) rather than the client protocol.
//
// The bridge needs this link because nats-server drops publishes from
// client connections whose reply subject starts with "$JS.ACK.", which is
// exactly the reply every pulled JetStream message carries; leafnode
// connections are exempt. As a bonus, a reply of the form
// "$JS.ACK.<9 tokens>@<subject>" published to a client's inbox is rewritten
// by the server so that the client sees <subject> as the message subject and
// the bare "$JS.ACK..." as its reply.
//
// The package holds three pieces: Parser, a pure incremental decoder of what
// the server sends; a subject trie used both for the interest the server
// announces (HasInterest) and for local subscriptions; and Conn, which ties
// them to a socket with a coalescing writer goroutine.
package leaf
