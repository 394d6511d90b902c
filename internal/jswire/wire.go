package jswire

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
)

const hdrLine = "NATS/1.0"

// HeaderValue returns the first value of key in a raw NATS header block, or "". Keys
// compare case-insensitively: clients in some languages canonicalise them.
func HeaderValue(hdr []byte, key string) string {
	if len(hdr) == 0 {
		return ""
	}
	rest := hdr
	// Skip the status line.
	if i := bytes.Index(rest, []byte("\r\n")); i >= 0 {
		rest = rest[i+2:]
	} else {
		return ""
	}
	for len(rest) > 0 {
		i := bytes.Index(rest, []byte("\r\n"))
		if i < 0 {
			i = len(rest)
		}
		line := rest[:i]
		if i < len(rest) {
			rest = rest[i+2:]
		} else {
			rest = nil
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		if len(k) == len(key) && bytes.EqualFold(k, []byte(key)) {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}

// StatusHeader builds a header-only status message such as "NATS/1.0 404 No Messages",
// which every language's client parses inline. kv holds extra header pairs.
func StatusHeader(code int, desc string, kv ...string) []byte {
	line := hdrLine + " " + strconv.Itoa(code)
	if desc != "" {
		line += " " + desc
	}
	return AppendHeaders([]byte(line+"\r\n\r\n"), kv...)
}

// AppendHeaders returns a copy of a stored header block (or a new one when there is none)
// with the key-value pairs kv added at its end.
func AppendHeaders(hdr []byte, kv ...string) []byte {
	var b []byte
	if len(hdr) < 4 {
		b = append(b, hdrLine+"\r\n"...)
	} else {
		b = append(b, hdr[:len(hdr)-2]...)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		b = append(append(append(append(b, kv[i]...), ": "...), kv[i+1]...), "\r\n"...)
	}
	return append(b, "\r\n"...)
}

// APIResponse wraps the response types of the JetStream API so that every response carries
// its "type"; clients such as natscli validate it against a schema.
func APIResponse(typ string) server.ApiResponse { return server.ApiResponse{Type: typ} }

// ErrorResponse is a bare typed error response for API subjects whose response type has no
// other fields worth sending.
func ErrorResponse(typ string, e *server.ApiError) *server.ApiResponse {
	return &server.ApiResponse{Type: typ, Error: e}
}

// IsEmptyRequest reports whether a body carries no request, for the API subjects that take
// none: nothing but white space, or an empty JSON object. Anything else is refused, as
// nats-server does, so that a stray body never passes for a delete.
func IsEmptyRequest(data []byte) bool {
	if len(bytes.TrimSpace(data)) == 0 {
		return true
	}
	var v map[string]json.RawMessage
	return json.Unmarshal(data, &v) == nil && v != nil && len(v) == 0
}

// DecodeRequest unmarshals an API request body; an empty body is an empty request.
// Unknown fields are tolerated, as nats-server does.
func DecodeRequest(data []byte, v any) *server.ApiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return server.NewJSInvalidJSONError(err)
	}
	return nil
}

// PubAckPrefix is the constant start of every PubAck of a stream: it is built once, so an
// ack costs no JSON encoding.
func PubAckPrefix(stream string) []byte { return PubAckPrefixIn(stream, "") }

// PubAckPrefixIn is PubAckPrefix for a stream of a JetStream domain, which nats-server
// names in every PubAck after the stream.
func PubAckPrefixIn(stream, domain string) []byte {
	name, _ := json.Marshal(stream)
	b := append([]byte(`{"stream":`), name...)
	if domain != "" {
		d, _ := json.Marshal(domain)
		b = append(append(b, `,"domain":`...), d...)
	}
	return append(b, `,"seq":`...)
}

// PubAck is the PubAck of a stored message, after its stream's PubAckPrefix.
func PubAck(prefix []byte, seq uint64, duplicate bool) []byte {
	b := make([]byte, 0, len(prefix)+40)
	b = append(b, prefix...)
	b = strconv.AppendUint(b, seq, 10)
	if duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	return append(b, '}')
}

// PubAckCounter is the PubAck of a counter increment, with the subject's new total.
func PubAckCounter(prefix []byte, seq uint64, val string) []byte {
	b := make([]byte, 0, len(prefix)+len(val)+32)
	b = append(b, prefix...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"val":`...)
	b = strconv.AppendQuote(b, val)
	return append(b, '}')
}

// PubAckBatch is the PubAck of an atomic batch's commit: its last message's, naming the
// batch and how many messages it stored, as nats-server writes it.
func PubAckBatch(prefix []byte, seq uint64, batch string, count int) []byte {
	b := make([]byte, 0, len(prefix)+len(batch)+60)
	b = append(b, prefix...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"batch":`...)
	b = strconv.AppendQuote(b, batch)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(count), 10)
	return append(b, '}')
}

// PubError is a PubAck that carries an error, as JetStream sends it.
func PubError(stream string, e *server.ApiError) []byte {
	b, _ := json.Marshal(struct {
		Error  *server.ApiError `json:"error"`
		Stream string           `json:"stream"`
		Seq    uint64           `json:"seq"`
	}{e, stream, 0})
	return b
}
