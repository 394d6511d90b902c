package jswire

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// FuzzSeqFields feeds sequences at and around the edges of what jetgres stores to the
// decoders and checks of every request field that becomes a stored sequence: STREAM.PURGE's
// seq (and keep, a count beside it), a stream's first_seq, a consumer's opt_start_seq, an
// ack subject's stream and consumer sequences. Nothing accepted may exceed MaxSeq, nothing at or below it may be
// refused for its size, and a refusal is a 400 that names the field.
func FuzzSeqFields(f *testing.F) {
	edges := []uint64{0, 1, 1 << 53, MaxSeq - 1, MaxSeq, MaxSeq + 1, 1 << 63, math.MaxUint64}
	for _, a := range edges {
		for _, b := range edges {
			f.Add(a, b)
		}
	}
	scfg := server.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 1}
	f.Fuzz(func(t *testing.T, a, b uint64) {
		var purge server.JSApiStreamPurgeRequest
		if e := DecodeRequest(fmt.Appendf(nil, `{"seq":%d,"keep":%d}`, a, b), &purge); e != nil || purge.Sequence != a || purge.Keep != b {
			t.Fatalf("purge seq %d keep %d decoded as %+v (%v)", a, b, purge, e)
		}
		switch e := CheckPurgeRequest(&purge); {
		case e == nil && (a > MaxSeq || a > 0 && b > 0):
			t.Fatalf("purge seq %d keep %d accepted", a, b)
		case e != nil && e.Code != 400:
			t.Fatalf("purge seq %d keep %d: %+v, want a 400", a, b, e)
		case e != nil && a <= MaxSeq && (a == 0 || b == 0):
			t.Fatalf("purge seq %d keep %d refused: %+v", a, b, e)
		case e != nil && a > MaxSeq && b == 0 && !strings.Contains(e.Description, fmt.Sprintf("seq %d", a)):
			t.Fatalf("purge seq %d refused without naming the field: %+v", a, e)
		}

		var stream server.StreamConfig
		if e := DecodeRequest(fmt.Appendf(nil, `{"name":"S","subjects":["s.>"],"first_seq":%d}`, a), &stream); e != nil || stream.FirstSeq != a {
			t.Fatalf("stream with first_seq %d decoded as %+v (%v)", a, stream, e)
		}
		switch cfg, e := CheckStreamConfig(stream, fuzzMaxPayload); {
		case e == nil && (cfg.FirstSeq > MaxSeq || cfg.FirstSeq != a):
			t.Fatalf("stream with first_seq %d accepted as %d", a, cfg.FirstSeq)
		case e != nil && a <= MaxSeq:
			t.Fatalf("stream with first_seq %d refused: %+v", a, e)
		case e != nil && (e.Code != 400 || !strings.Contains(e.Description, fmt.Sprintf("first_seq %d", a))):
			t.Fatalf("stream with first_seq %d: %+v, want a 400 naming first_seq", a, e)
		}

		var create server.CreateConsumerRequest
		body := fmt.Appendf(nil, `{"stream_name":"S","config":{"durable_name":"C","deliver_policy":"by_start_sequence","opt_start_seq":%d}}`, a)
		if e := DecodeRequest(body, &create); e != nil || create.Config.OptStartSeq != a {
			t.Fatalf("consumer with opt_start_seq %d decoded as %+v (%v)", a, create.Config, e)
		}
		switch cfg, e := CheckConsumerConfig(create.Config, &scfg); {
		case e == nil && (cfg.OptStartSeq > MaxSeq || cfg.OptStartSeq != a):
			t.Fatalf("consumer with opt_start_seq %d accepted as %d", a, cfg.OptStartSeq)
		case e != nil && e.Code != 400:
			t.Fatalf("consumer with opt_start_seq %d: %+v, want a 400", a, e)
		case e != nil && a > 0 && a <= MaxSeq:
			t.Fatalf("consumer with opt_start_seq %d refused: %+v", a, e)
		case a > MaxSeq && (e == nil || !strings.Contains(e.Description, "opt_start_seq")):
			t.Fatalf("consumer with opt_start_seq %d: %+v, want a refusal naming opt_start_seq", a, e)
		}

		for _, subject := range []string{fmt.Sprintf("$JS.ACK.S.C.1.%d.%d.0.0", a, b), fmt.Sprintf("$JS.ACK.D.H.S.C.1.%d.%d.0.0.tok", a, b)} {
			ack, ok := ParseAckSubject(subject)
			switch {
			case ok && (ack.StreamSeq != a || ack.ConsumerSeq != b):
				t.Fatalf("%s parsed as %+v", subject, ack)
			case ok && (a > MaxSeq || b > MaxSeq):
				t.Fatalf("%s accepted", subject)
			case !ok && a <= MaxSeq && b <= MaxSeq:
				t.Fatalf("%s refused", subject)
			}
		}
	})
}
