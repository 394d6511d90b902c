// Package bridge owns JetStream semantics: it is the only package that knows the JetStream
// wire format. It serves the $JS.API management subjects, takes publishes to stream subjects
// through push fusion (one PostgreSQL transaction per bundle, a PubAck only after commit),
// serves pull consumers from a tick-driven tail cache, and turns acks into cursor writes.
//
// The bridge reaches NATS clients through a leafnode link to the embedded server (see
// package leaf): a link handler runs on the link's read loop, so nothing here blocks in one.
// It reaches PostgreSQL only through package pg, and every hot-path database call holds a
// permit of a flow lane first: push for appends, pop for reads behind the tail cache.
package bridge
