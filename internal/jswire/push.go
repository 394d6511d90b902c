package jswire

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// FCPrefix starts the reply subject of every flow-control request a push consumer sends,
// and so every answer to one: $JS.FC.<stream>.<consumer>.<id>, nats-server's v1 layout.
const FCPrefix = "$JS.FC."

// DescPushBased answers a pull request sent to a push consumer.
const DescPushBased = "Consumer is push based"

const descFlowControl = "FlowControl Request"

// fcIDDigits are the digits of a flow-control request's id, as nats-server draws them.
const fcIDDigits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// FlowControlSubject is the reply subject of a flow-control request; r picks its id, four
// base-62 digits as nats-server sends: a client answers the newest request only, so the id
// need only differ from the one before.
func FlowControlSubject(stream, consumer string, r uint64) string {
	var b strings.Builder
	b.Grow(len(FCPrefix) + len(stream) + len(consumer) + 6)
	b.WriteString(FCPrefix)
	b.WriteString(stream)
	b.WriteByte('.')
	b.WriteString(consumer)
	b.WriteByte('.')
	for range 4 {
		b.WriteByte(fcIDDigits[r%uint64(len(fcIDDigits))])
		r /= uint64(len(fcIDDigits))
	}
	return b.String()
}

// ParseFlowControlSubject reads the stream and consumer an answer to a flow-control
// request is for.
func ParseFlowControlSubject(subject string) (stream, consumer string, ok bool) {
	rest, ok := strings.CutPrefix(subject, FCPrefix)
	if !ok {
		return "", "", false
	}
	stream, rest, ok1 := strings.Cut(rest, ".")
	consumer, id, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || stream == "" || consumer == "" || id == "" || strings.Contains(id, ".") {
		return "", "", false
	}
	return stream, consumer, true
}

// FlowControlStatus is the flow-control request itself: a status line and no body, sent to
// the deliver subject with FlowControlSubject as its reply.
func FlowControlStatus() []byte {
	return StatusHeader(100, descFlowControl)
}

// FlowControlAck reads what an answer to a flow-control request acknowledges under the
// flow_control ack policy: the Nats-Last-Stream and Nats-Last-Consumer headers a sourcing
// stream puts on it. As in nats-server, an answer without a positive stream sequence acks
// nothing, and one without a positive consumer sequence acks with consumer sequence 0.
func FlowControlAck(hdr []byte) (sseq, dseq uint64, ok bool) {
	sseq, err := strconv.ParseUint(HeaderValue(hdr, server.JSLastStreamSeq), 10, 64)
	if err != nil || sseq == 0 {
		return 0, 0, false
	}
	dseq, err = strconv.ParseUint(HeaderValue(hdr, server.JSLastConsumerSeq), 10, 64)
	if err != nil {
		dseq = 0
	}
	return sseq, dseq, true
}

// PushHeartbeatStatus is a push consumer's idle heartbeat: HeartbeatStatus, and while a
// flow-control request is unanswered (stalled, its reply subject) the header that lets a
// client which missed the request answer it.
func PushHeartbeatStatus(consumerSeq, streamSeq uint64, stalled string) []byte {
	hdr := HeartbeatStatus(consumerSeq, streamSeq)
	if stalled == "" {
		return hdr
	}
	return AppendHeaders(hdr, server.JSConsumerStalled, stalled)
}
