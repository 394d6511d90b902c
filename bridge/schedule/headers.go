package schedule

import (
	"bytes"
	"strings"
)

// withoutHeaders is a copy of a header block without the lines whose key drop reports;
// keys are compared as nats-server compares them when it strips a produced message's
// headers, case and all.
func withoutHeaders(hdr []byte, drop func(key string) bool) []byte {
	if len(hdr) == 0 {
		return nil
	}
	status, rest, ok := bytes.Cut(hdr, []byte("\r\n"))
	if !ok {
		return nil
	}
	out := append(append(make([]byte, 0, len(hdr)), status...), "\r\n"...)
	for len(rest) > 0 {
		line, tail, _ := bytes.Cut(rest, []byte("\r\n"))
		rest = tail
		if len(line) == 0 {
			continue
		}
		key, _, _ := strings.Cut(string(line), ":")
		if drop(key) {
			continue
		}
		out = append(append(out, line...), "\r\n"...)
	}
	return append(out, "\r\n"...)
}
