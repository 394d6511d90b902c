package stream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// A counter stream (allow_msg_counter) stores, for each publish with a Nats-Incr header,
// its subject's new total as the body {"val":"<total>"}, under the headers as published,
// and answers with the total in the PubAck's "val". The total is the last live message's
// plus the increment, decided by pg under the stream's row lock (pg.AppendMsg.Derive), so
// that publishers incrementing one subject at once, through any replica, sum exactly. A
// delete or purge that takes a subject's last message leaves the one before it, or nothing,
// to add to, as nats-server's "load the last message" does.

// checkIncr refuses a Nats-Incr header as nats-server does before any other header: one
// that is not a signed integer, one on a stream that does not allow counters, one on a
// publish with a body or with a header a counter cannot honour.
func checkIncr(cfg *server.StreamConfig, hdr []byte, dataLen int) *server.ApiError {
	v := jswire.HeaderValue(hdr, server.JSMessageIncr)
	if v == "" {
		return nil
	}
	if _, ok := new(big.Int).SetString(v, 10); !ok {
		return server.NewJSMessageIncrInvalidError()
	}
	switch {
	case !cfg.AllowMsgCounter:
		return server.NewJSMessageIncrDisabledError()
	case dataLen > 0:
		return server.NewJSMessageIncrPayloadError()
	}
	for _, h := range []string{server.JSMsgRollup, server.JSExpectedStream, server.JSExpectedLastMsgId,
		server.JSExpectedLastSubjSeqSubj, server.JSExpectedLastSeq, server.JSExpectedLastSubjSeq} {
		if jswire.HeaderValue(hdr, h) != "" {
			return server.NewJSMessageIncrInvalidError()
		}
	}
	return nil
}

// counterDerive is what a publish to a counter stream stores: its increment added to the
// subject's last total. A publish without Nats-Incr is refused there, after de-duplication
// and expectations have had their say, as nats-server refuses it.
func counterDerive(cfg *server.StreamConfig, hdr []byte) pg.DeriveFunc {
	v := jswire.HeaderValue(hdr, server.JSMessageIncr)
	if v == "" {
		return func(*pg.Message) ([]byte, []byte, error) { return nil, nil, server.NewJSMessageIncrMissingError() }
	}
	// checkIncr has refused what does not parse.
	incr, _ := new(big.Int).SetString(v, 10)
	maxMsgSize := int(cfg.MaxMsgSize)
	return func(last *pg.Message) ([]byte, []byte, error) {
		var total big.Int
		out := hdr
		if last != nil {
			var val server.CounterValue
			if json.Unmarshal(last.Data, &val) != nil {
				return nil, nil, server.NewJSMessageCounterBrokenError()
			}
			// Sources carry their totals in a header, which each increment keeps.
			if ncs := jswire.HeaderValue(last.Header, server.JSMessageCounterSources); ncs != "" {
				var sources server.CounterSources
				if json.Unmarshal([]byte(ncs), &sources) != nil {
					return nil, nil, server.NewJSMessageCounterBrokenError()
				}
				if len(sources) > 0 {
					b, _ := json.Marshal(sources)
					out = setHeader(out, server.JSMessageCounterSources, string(b))
				}
			}
			total.SetString(val.Value, 10)
		}
		total.Add(&total, incr)
		data := fmt.Appendf(nil, "{%q:%q}", "val", total.String())
		if maxMsgSize >= 0 && (len(out) > maxMsgSize || len(data) > maxMsgSize-len(out)) {
			return nil, nil, server.NewJSStreamMessageExceedsMaximumError()
		}
		return out, data, nil
	}
}

// setHeader returns hdr with key's value replaced, or added at the end when hdr has no such
// key; hdr itself is left as it is.
func setHeader(hdr []byte, key, value string) []byte {
	line := []byte("\r\n" + key + ":")
	i := bytes.Index(hdr, line)
	if i < 0 {
		return jswire.AppendHeaders(hdr, key, value)
	}
	start := i + len(line)
	end := bytes.Index(hdr[start:], []byte("\r\n"))
	if end < 0 {
		return hdr
	}
	out := make([]byte, 0, len(hdr)+len(value))
	out = append(append(out, hdr[:start]...), ' ')
	out = append(out, value...)
	return append(out, hdr[start+end:]...)
}

// counterVal is the total a counter message's body holds, for its PubAck.
func counterVal(data string) string {
	var val server.CounterValue
	_ = json.Unmarshal([]byte(data), &val)
	return val.Value
}
