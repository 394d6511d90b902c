// Package jswire owns the JetStream wire format as jetgres speaks it, with no state of its
// own: the $JS.ACK reply subjects of deliveries and the ack bodies sent to them, MSG.NEXT
// pull requests and the status lines that answer them, NATS header blocks, PubAcks, the
// decoding of JSON API requests and direct gets, and the checks and defaults of stream and
// consumer configurations, with the errors nats-server answers them with.
//
// Everything here is a function of its arguments, so it is fuzzed on its own. The ack
// subject parser and builder run once per delivered message and once per ack: they do not
// allocate.
package jswire
