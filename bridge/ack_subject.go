package bridge

import (
	"math"
	"strconv"
	"strings"
)

// ackPrefix starts every delivered message's reply subject, and so every ack.
const ackPrefix = "$JS.ACK."

// ackInfo is what a delivered message's reply subject carries:
// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>.
// Clients read it as message metadata and send acks to it.
type ackInfo struct {
	stream    string
	consumer  string
	delivered uint64 // delivery count
	sseq      uint64
	dseq      uint64
	ts        int64 // unix ns the message was stored
	pending   uint64
}

// appendAckSubject appends the reply subject of a delivery to b. nats.go v1.55 rejects any
// other form, so this is the 9-token v1 layout exactly.
func appendAckSubject(b []byte, a ackInfo) []byte {
	b = append(b, ackPrefix...)
	b = append(b, a.stream...)
	b = append(b, '.')
	b = append(b, a.consumer...)
	b = append(b, '.')
	b = strconv.AppendUint(b, a.delivered, 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, a.sseq, 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, a.dseq, 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, a.ts, 10)
	b = append(b, '.')
	return strconv.AppendUint(b, a.pending, 10)
}

// parseAckSubject reads an ack subject. Besides the v1 layout it accepts nats-server's v2
// layout ($JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<5 numbers>[.<more>]) so that
// acks from clients that rebuild the subject still land. Numbers must be plain decimals.
func parseAckSubject(subject string) (ackInfo, bool) {
	rest, ok := strings.CutPrefix(subject, ackPrefix)
	if !ok {
		return ackInfo{}, false
	}
	var tok [16]string
	n := 0
	for n < len(tok) {
		t, r, more := strings.Cut(rest, ".")
		tok[n] = t
		n++
		if !more {
			rest = ""
			break
		}
		rest = r
	}
	if rest != "" {
		return ackInfo{}, false
	}
	var t []string
	switch {
	case n == 7:
		t = tok[:7]
	case n >= 9:
		t = tok[2:9]
	default:
		return ackInfo{}, false
	}
	if t[0] == "" || t[1] == "" {
		return ackInfo{}, false
	}
	a := ackInfo{stream: t[0], consumer: t[1]}
	var nums [5]uint64
	for i := range nums {
		v, ok := parseDecimal(t[2+i])
		if !ok {
			return ackInfo{}, false
		}
		nums[i] = v
	}
	if nums[3] > 1<<63-1 {
		return ackInfo{}, false
	}
	a.delivered, a.sseq, a.dseq, a.ts, a.pending = nums[0], nums[1], nums[2], int64(nums[3]), nums[4]
	return a, true
}

// parseDecimal accepts only ASCII digits, no sign, and no overflow. It runs five times
// for every ack, so it does the work of strconv.ParseUint without its generality.
func parseDecimal(s string) (uint64, bool) {
	if s == "" || len(s) > 20 {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		d := uint64(s[i]) - '0'
		if d > 9 || v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}
