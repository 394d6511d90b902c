package bridge

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats-server/v2/server"
)

const hdrLine = "NATS/1.0"

// headerValue returns the first value of key in a raw NATS header block, or "". Keys
// compare case-insensitively: clients in some languages canonicalise them.
func headerValue(hdr []byte, key string) string {
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

// statusHeader builds a header-only status message such as "NATS/1.0 404 No Messages",
// which every language's client parses inline. kv holds extra header pairs.
func statusHeader(code int, desc string, kv ...string) []byte {
	line := hdrLine + " " + strconv.Itoa(code)
	if desc != "" {
		line += " " + desc
	}
	return appendHeaders([]byte(line+"\r\n\r\n"), kv...)
}

// appendHeaders returns a copy of a stored header block (or a new one when there is none)
// with the key-value pairs kv added at its end.
func appendHeaders(hdr []byte, kv ...string) []byte {
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

// apiResponse wraps the response types of the JetStream API so that every response carries
// its "type"; clients such as natscli validate it against a schema.
func apiResponse(typ string) server.ApiResponse { return server.ApiResponse{Type: typ} }

// pubAckPrefix is the constant start of every PubAck of a stream: it is built once, so an
// ack costs no JSON encoding.
func pubAckPrefix(stream string) []byte {
	name, _ := json.Marshal(stream)
	return append(append([]byte(`{"stream":`), name...), `,"seq":`...)
}

func pubAck(prefix []byte, seq uint64, duplicate bool) []byte {
	b := make([]byte, 0, len(prefix)+40)
	b = append(b, prefix...)
	b = strconv.AppendUint(b, seq, 10)
	if duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	return append(b, '}')
}

// pubError is a PubAck that carries an error, as JetStream sends it.
func pubError(stream string, e *server.ApiError) []byte {
	b, _ := json.Marshal(struct {
		Error  *server.ApiError `json:"error"`
		Stream string           `json:"stream"`
		Seq    uint64           `json:"seq"`
	}{e, stream, 0})
	return b
}
