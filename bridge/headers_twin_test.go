package bridge

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pubRaw publishes msg on both sides as a request and fails unless the two answers are the
// same bytes: the PubAck, or the error object and the stream it names.
func (tw *twin) pubRaw(what string, msg *nats.Msg) []byte {
	tw.t.Helper()
	var got [2][]byte
	for side, js := range tw.js {
		m := *msg
		reply, err := js.Conn().RequestMsg(&m, 10*time.Second)
		if err != nil {
			tw.t.Fatalf("%s: %s: %v", sideName[side], what, err)
		}
		got[side] = reply.Data
	}
	if !bytes.Equal(got[ours], got[theirs]) {
		tw.t.Fatalf("%s:\njetgres   %s\njetstream %s", what, got[ours], got[theirs])
	}
	return got[ours]
}

// The headers of the features a stream does not allow are refused as nats-server refuses
// them, with the same PubAck bytes, and nothing is stored.
func TestUnallowedHeadersTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "H", Subjects: []string{"h.>"}})
	tw.pub("h.first", []byte("x"))

	for _, c := range []struct {
		name string
		hdr  nats.Header
	}{
		{"counter increment", nats.Header{"Nats-Incr": {"1"}}},
		{"counter increment not a number", nats.Header{"Nats-Incr": {"one"}}},
		{"counter increment before expected stream", nats.Header{"Nats-Incr": {"1"}, "Nats-Expected-Stream": {"OTHER"}}},
		{"ttl", nats.Header{"Nats-TTL": {"1m"}}},
		{"ttl in seconds", nats.Header{"Nats-TTL": {"30"}}},
		{"ttl never", nats.Header{"Nats-TTL": {"never"}}},
		{"ttl under a second", nats.Header{"Nats-TTL": {"500ms"}}},
		{"ttl zero", nats.Header{"Nats-TTL": {"0"}}},
		{"ttl not a duration", nats.Header{"Nats-TTL": {"soon"}}},
		{"expected stream before ttl", nats.Header{"Nats-TTL": {"1m"}, "Nats-Expected-Stream": {"OTHER"}}},
		{"schedule", nats.Header{"Nats-Schedule": {"@every 1m"}, "Nats-Schedule-Target": {"h.target"}}},
		{"schedule that does not parse", nats.Header{"Nats-Schedule": {"whenever"}}},
		{"schedule time zone unknown", nats.Header{"Nats-Schedule-Time-Zone": {"Nowhere/Town"}}},
		{"schedule next purge", nats.Header{"Nats-Schedule-Next": {"purge"}, "Nats-Scheduler": {"h.sched"}}},
		{"schedule next without scheduler", nats.Header{"Nats-Schedule-Next": {"purge"}}},
		{"schedule next not purge", nats.Header{"Nats-Schedule-Next": {"later"}, "Nats-Scheduler": {"h.sched"}}},
		{"scheduler alone", nats.Header{"Nats-Scheduler": {"h.sched"}}},
		{"stream source", nats.Header{"Nats-Stream-Source": {"OTHER 1 > > h.x"}}},
		{"subject filter without sequence", nats.Header{"Nats-Expected-Last-Subject-Sequence-Subject": {"h.x"}}},
		{"batch", nats.Header{"Nats-Batch-Id": {"b1"}, "Nats-Batch-Sequence": {"1"}}},
		{"batch before ttl", nats.Header{"Nats-Batch-Id": {"b1"}, "Nats-Batch-Sequence": {"1"}, "Nats-TTL": {"1m"}}},
	} {
		if ans := tw.pubRaw(c.name, &nats.Msg{Subject: "h.x", Header: c.hdr, Data: []byte("x")}); !bytes.Contains(ans, []byte(`"error"`)) {
			t.Fatalf("%s: stored: %s", c.name, ans)
		}
	}
	fast := &nats.Msg{Subject: "h.x", Reply: "_INBOX.fast.b1.10.fail.1.0.$FI", Data: []byte("x")}
	var got [2][]byte
	for side, js := range tw.js {
		sub, err := js.Conn().SubscribeSync(fast.Reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := js.Conn().PublishMsg(fast); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: fast batch: %v", sideName[side], err)
		}
		got[side] = m.Data
		_ = sub.Unsubscribe()
	}
	if !bytes.Equal(got[ours], got[theirs]) || !strings.Contains(string(got[ours]), "error") {
		t.Fatalf("fast batch:\njetgres   %s\njetstream %s", got[ours], got[theirs])
	}
	if st := tw.state("H"); st.Msgs != 1 {
		t.Fatalf("stored %d messages, want only the first", st.Msgs)
	}
}
