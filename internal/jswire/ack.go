package jswire

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// AckPrefix starts every delivered message's reply subject, and so every ack.
const AckPrefix = "$JS.ACK."

// AckInfo is what a delivered message's reply subject carries:
// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>.
// Clients read it as message metadata and send acks to it.
type AckInfo struct {
	Stream      string
	Consumer    string
	Delivered   uint64 // delivery count
	StreamSeq   uint64
	ConsumerSeq uint64
	TS          int64 // unix ns the message was stored
	Pending     uint64
}

// AppendAckSubject appends the reply subject of a delivery to b. nats.go v1.55 rejects any
// other form, so this is the 9-token v1 layout exactly.
func AppendAckSubject(b []byte, a AckInfo) []byte {
	b = append(b, AckPrefix...)
	b = append(b, a.Stream...)
	b = append(b, '.')
	b = append(b, a.Consumer...)
	b = append(b, '.')
	b = strconv.AppendUint(b, a.Delivered, 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, a.StreamSeq, 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, a.ConsumerSeq, 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, a.TS, 10)
	b = append(b, '.')
	return strconv.AppendUint(b, a.Pending, 10)
}

// ParseAckSubject reads an ack subject. Besides the v1 layout it accepts nats-server's v2
// layout ($JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<5 numbers>[.<more>]) so that
// acks from clients that rebuild the subject still land. Numbers must be plain decimals.
func ParseAckSubject(subject string) (AckInfo, bool) {
	rest, ok := strings.CutPrefix(subject, AckPrefix)
	if !ok {
		return AckInfo{}, false
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
		return AckInfo{}, false
	}
	var t []string
	switch {
	case n == 7:
		t = tok[:7]
	case n >= 9:
		t = tok[2:9]
	default:
		return AckInfo{}, false
	}
	if t[0] == "" || t[1] == "" {
		return AckInfo{}, false
	}
	a := AckInfo{Stream: t[0], Consumer: t[1]}
	var nums [5]uint64
	for i := range nums {
		v, ok := parseDecimal(t[2+i])
		if !ok {
			return AckInfo{}, false
		}
		nums[i] = v
	}
	// No delivery carries a sequence above MaxSeq: such an ack is forged, and must not
	// reach anything that stores sequences.
	if nums[3] > 1<<63-1 || nums[1] > MaxSeq || nums[2] > MaxSeq {
		return AckInfo{}, false
	}
	a.Delivered, a.StreamSeq, a.ConsumerSeq, a.TS, a.Pending = nums[0], nums[1], nums[2], int64(nums[3]), nums[4]
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

// Ack bodies, as clients send them. AckNext and AckNak start bodies that carry arguments
// after them; they are not to be changed.
var (
	ackAck      = []byte("+ACK")
	ackOK       = []byte("+OK")
	AckNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
	AckNext     = []byte("+NXT")
	ackTerm     = []byte("+TERM")
)

// AckKind is what an ack body asks for.
type AckKind uint8

const (
	AckUnknown  AckKind = iota
	AckPositive         // empty, +ACK or +OK
	AckNextKind         // +NXT: an ack and a pull request
	AckNakKind          // -NAK, with or without a delay
	AckWPIKind          // +WPI: more time
	AckTermKind         // +TERM: never again
)

// ClassifyAck says what an ack body asks for.
func ClassifyAck(body []byte) AckKind {
	switch {
	case len(body) == 0, bytes.Equal(body, ackAck), bytes.Equal(body, ackOK):
		return AckPositive
	case bytes.HasPrefix(body, AckNext):
		return AckNextKind
	case bytes.HasPrefix(body, AckNak):
		return AckNakKind
	case bytes.Equal(body, ackProgress):
		return AckWPIKind
	case bytes.HasPrefix(body, ackTerm):
		return AckTermKind
	}
	return AckUnknown
}

// AckSettles reports whether an ack body acknowledges its message for good (an ack, +NXT or
// a term), as retention counts it, rather than asking for it again or for more time.
func AckSettles(body []byte) bool {
	switch ClassifyAck(body) {
	case AckPositive, AckNextKind, AckTermKind:
		return true
	}
	return false
}

// NakDelay reads the optional delay of a -NAK: "{"delay":ns}" or a Go duration. Anything
// else is a plain nak, as in nats-server.
func NakDelay(arg []byte) time.Duration {
	arg = bytes.TrimSpace(arg)
	if len(arg) == 0 {
		return 0
	}
	if arg[0] == '{' {
		var o server.ConsumerNakOptions
		if json.Unmarshal(arg, &o) == nil {
			return o.Delay
		}
		return 0
	}
	d, err := time.ParseDuration(string(arg))
	if err != nil {
		return 0
	}
	return d
}
