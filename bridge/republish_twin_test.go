package bridge

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// sameConfigKeys fails unless both answers carry the same values of the given config keys;
// with no keys, unless both carry the same error.
func (tw *twin) sameConfigKeys(what string, got [2]map[string]any, keys ...string) {
	tw.t.Helper()
	if fmt.Sprint(got[ours]["error"]) != fmt.Sprint(got[theirs]["error"]) || (len(keys) > 0 && got[ours]["error"] != nil) {
		tw.t.Fatalf("%s: error jetgres %v, JetStream %v", what, got[ours]["error"], got[theirs]["error"])
	}
	for _, k := range keys {
		var v [2]string
		for side := range got {
			cfg, _ := got[side]["config"].(map[string]any)
			v[side] = fmt.Sprint(cfg[k])
		}
		if v[ours] != v[theirs] {
			tw.t.Fatalf("%s: %s jetgres %s, JetStream %s", what, k, v[ours], v[theirs])
		}
	}
}

// sameAPIError fails unless both sides refuse the request with the same error.
func (tw *twin) sameAPIError(what, subject, body string) {
	tw.t.Helper()
	got := tw.apiRaw(subject, body)
	if got[ours]["error"] == nil {
		tw.t.Fatalf("%s: jetgres took it; JetStream answered %v", what, got[theirs]["error"])
	}
	tw.sameConfigKeys(what, got)
}

// republished subscribes to subject on both sides.
func (tw *twin) republished(subject string) [2]*nats.Subscription {
	tw.t.Helper()
	var subs [2]*nats.Subscription
	for side, js := range tw.js {
		sub, err := js.Conn().SubscribeSync(subject)
		if err != nil {
			tw.t.Fatal(err)
		}
		if err := js.Conn().Flush(); err != nil {
			tw.t.Fatal(err)
		}
		tw.t.Cleanup(func() { _ = sub.Unsubscribe() })
		subs[side] = sub
	}
	return subs
}

// nextRepublished takes the next message of both subscriptions and fails unless they are
// the same: subject, payload and headers, the time stamp as each side stored the message.
func (tw *twin) nextRepublished(what string, subs [2]*nats.Subscription, stream string) *nats.Msg {
	tw.t.Helper()
	var got [2]*nats.Msg
	for side, sub := range subs {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			tw.t.Fatalf("%s: %s: no republished message: %v", what, sideName[side], err)
		}
		got[side] = m
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			tw.t.Fatalf("%s: %s: Nats-Sequence %q", what, sideName[side], m.Header.Get(jetstream.SequenceHeader))
		}
		s, err := tw.js[side].Stream(tw.ctx, stream)
		if err != nil {
			tw.t.Fatal(err)
		}
		stored, err := s.GetMsg(tw.ctx, seq)
		if err != nil {
			tw.t.Fatalf("%s: %s: get %d: %v", what, sideName[side], seq, err)
		}
		if ts := m.Header.Get(jetstream.TimeStampHeaer); ts != stored.Time.UTC().Format(time.RFC3339Nano) {
			tw.t.Fatalf("%s: %s: Nats-Time-Stamp %q, stored at %s", what, sideName[side], ts, stored.Time.UTC().Format(time.RFC3339Nano))
		}
	}
	a, b := got[ours], got[theirs]
	ha, hb := maps.Clone(a.Header), maps.Clone(b.Header)
	delete(ha, jetstream.TimeStampHeaer)
	delete(hb, jetstream.TimeStampHeaer)
	if a.Subject != b.Subject || string(a.Data) != string(b.Data) || !maps.EqualFunc(ha, hb, slices.Equal) {
		tw.t.Fatalf("%s:\njetgres   %s %q %v\njetstream %s %q %v", what, a.Subject, a.Data, ha, b.Subject, b.Data, hb)
	}
	return a
}

// Republish as nats-server does it: the config as create, update and info answer it, every
// refusal with the same error, and the messages sent once stored, with the same subjects,
// headers (Nats-Last-Sequence the subject's previous message) and payloads, headers_only too.
func TestRepublishTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)

	const create = "$JS.API.STREAM.CREATE."
	tw.sameAPIError("destination inside the stream's subjects", create+"RX",
		`{"name":"RX","subjects":["rx.>"],"republish":{"src":"rx.>","dest":"rx.out.>"}}`)
	tw.sameAPIError("destination capturing everything", create+"RX",
		`{"name":"RX","subjects":["rx.>"],"republish":{"dest":">"}}`)
	tw.sameAPIError("mapping that does not compile", create+"RX",
		`{"name":"RX","subjects":["rx.>"],"republish":{"src":"rx.*","dest":"out.{{wildcard(2)}}"}}`)
	tw.sameAPIError("source with a full wildcard, destination without", create+"RX",
		`{"name":"RX","subjects":["rx.>"],"republish":{"src":"rx.>","dest":"out.x"}}`)

	tw.sameConfigKeys("create", tw.apiRaw(create+"R", `{"name":"R","subjects":["r.>"],"republish":{"src":"r.>","dest":"rp.>"}}`), "republish")
	tw.streams = append(tw.streams, "R")
	tw.sameConfigKeys("info", tw.apiRaw("$JS.API.STREAM.INFO.R", ""), "republish")
	tw.sameAPIError("no source, a destination without a full wildcard", create+"RS",
		`{"name":"RS","subjects":["rs.>"],"republish":{"dest":"rsp.{{wildcard(1)}}"}}`)
	tw.sameConfigKeys("create with no source", tw.apiRaw(create+"RS", `{"name":"RS","subjects":["rs.>"],"republish":{"dest":"rsp.>"}}`), "republish")
	tw.streams = append(tw.streams, "RS")

	subs := tw.republished("rp.>")
	tw.pub("r.a", []byte("one"))
	tw.nextRepublished("first of its subject", subs, "R")
	tw.pub("r.b", []byte("two"))
	tw.nextRepublished("first of another subject", subs, "R")
	tw.pub("r.a", []byte("three"))
	if m := tw.nextRepublished("second of a subject", subs, "R"); m.Header.Get(jetstream.LastSequenceHeader) != "1" {
		t.Fatalf("Nats-Last-Sequence %q, want 1", m.Header.Get(jetstream.LastSequenceHeader))
	}
	tw.pubRaw("with headers of its own", &nats.Msg{Subject: "r.c", Header: nats.Header{"Own": {"x"}, "Nats-Msg-Id": {"id1"}}, Data: []byte("four")})
	tw.nextRepublished("with headers of its own", subs, "R")
	// One commit of many messages, published without waiting.
	tw.pubAsync([]string{"r.a", "r.b", "r.c", "r.a"}, 16)
	for i := range 4 {
		tw.nextRepublished(fmt.Sprintf("asynchronous publish %d", i+1), subs, "R")
	}

	tw.sameConfigKeys("update to headers only", tw.apiRaw("$JS.API.STREAM.UPDATE.R", `{"name":"R","subjects":["r.>"],"republish":{"src":"r.>","dest":"rp.>","headers_only":true}}`), "republish")
	tw.pub("r.b", []byte("five"))
	if m := tw.nextRepublished("headers only", subs, "R"); len(m.Data) != 0 || m.Header.Get("Nats-Msg-Size") != "4" {
		t.Fatalf("headers only: payload %q, Nats-Msg-Size %q", m.Data, m.Header.Get("Nats-Msg-Size"))
	}
	tw.sameAPIError("update to a destination inside the subjects", "$JS.API.STREAM.UPDATE.R",
		`{"name":"R","subjects":["r.>"],"republish":{"src":"r.>","dest":"r.x.>"}}`)

	// Removed, nothing is republished; back, the next is the first to arrive.
	tw.sameConfigKeys("update without republish", tw.apiRaw("$JS.API.STREAM.UPDATE.R", `{"name":"R","subjects":["r.>"]}`), "republish")
	tw.pub("r.a", []byte("not republished"))
	tw.sameConfigKeys("update with a narrower source", tw.apiRaw("$JS.API.STREAM.UPDATE.R", `{"name":"R","subjects":["r.>"],"republish":{"src":"r.b","dest":"rp.only.b"}}`), "republish")
	tw.pub("r.a", []byte("outside the source"))
	tw.pub("r.b", []byte("six"))
	if m := tw.nextRepublished("after republish came back", subs, "R"); string(m.Data) != "six" || m.Subject != "rp.only.b" {
		t.Fatalf("after republish came back: %s %q", m.Subject, m.Data)
	}
	tw.compareAll("republish")

	// A queue subscriber of the destination gets its share, and a stream whose subjects
	// cover it stores it.
	// RD is checked by its message below, not by the twin's state comparison: a republished
	// message carries its Nats-Time-Stamp, whose RFC 3339 form drops trailing zeros, so the
	// two sides' byte counts differ by chance.
	tw.createStream(jetstream.StreamConfig{Name: "RD", Subjects: []string{"rd.>"}})
	tw.streams = slices.DeleteFunc(tw.streams, func(n string) bool { return n == "RD" })
	tw.sameConfigKeys("create into a stream", tw.apiRaw(create+"RQ", `{"name":"RQ","subjects":["rq.>"],"republish":{"src":"rq.>","dest":"rd.>"}}`), "republish")
	tw.streams = append(tw.streams, "RQ")
	var queued [2]*nats.Subscription
	for side, js := range tw.js {
		sub, err := js.Conn().QueueSubscribeSync("rd.>", "workers")
		if err != nil {
			t.Fatal(err)
		}
		if err := js.Conn().Flush(); err != nil {
			t.Fatal(err)
		}
		queued[side] = sub
	}
	tw.pub("rq.a", []byte("seven"))
	tw.nextRepublished("to a queue group and a stream", queued, "RQ")
	testwait.For(t, 10*time.Second, func() error {
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, "RD")
			if err != nil {
				return err
			}
			if n := s.CachedInfo().State.Msgs; n != 1 {
				return fmt.Errorf("%s: RD holds %d messages", sideName[side], n)
			}
		}
		return nil
	})
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, "RD")
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(tw.ctx, 1)
		if err != nil {
			t.Fatalf("%s: the stream under the destination: %v", sideName[side], err)
		}
		if m.Subject != "rd.a" || string(m.Data) != "seven" || m.Header.Get(jetstream.StreamHeader) != "RQ" {
			t.Fatalf("%s: the stream under the destination stored %s %q %v", sideName[side], m.Subject, m.Data, m.Header)
		}
	}
	tw.compareAll("republish into a stream")
}

// A stream's subject_transform as nats-server applies it: the subject a message is stored
// under, a subject the source does not match stored as published, its refusals, and a
// republish of ">" to ">" that follows the transform.
func TestSubjectTransformTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	const create = "$JS.API.STREAM.CREATE."
	tw.sameAPIError("invalid source", create+"TX", `{"name":"TX","subjects":["tx.>"],"subject_transform":{"src":"tx..a","dest":"y.>"}}`)
	tw.sameAPIError("invalid destination", create+"TX", `{"name":"TX","subjects":["tx.>"],"subject_transform":{"src":"tx.*","dest":"y.{{wildcard(3)}}"}}`)
	tw.sameAPIError("unknown function", create+"TX", `{"name":"TX","subjects":["tx.>"],"subject_transform":{"src":"tx.*","dest":"y.{{nosuch(1)}}"}}`)

	tw.sameConfigKeys("create", tw.apiRaw(create+"T", `{"name":"T","subjects":["t.>"],"subject_transform":{"src":"t.*.*","dest":"st.{{wildcard(2)}}.{{wildcard(1)}}"}}`), "subject_transform")
	tw.streams = append(tw.streams, "T")
	tw.pub("t.a.b", []byte("1"))
	tw.pub("t.c", []byte("2"))
	tw.pub("t.d.e", []byte("3"))
	tw.sameAPIError("partition of a wildcard the source lacks", "$JS.API.STREAM.UPDATE.T",
		`{"name":"T","subjects":["t.>"],"subject_transform":{"src":"t.>","dest":"p.{{partition(3,1)}}.>"}}`)
	tw.sameConfigKeys("update", tw.apiRaw("$JS.API.STREAM.UPDATE.T", `{"name":"T","subjects":["t.>"],"subject_transform":{"src":"t.*","dest":"p.{{partition(3,1)}}.{{wildcard(1)}}"}}`), "subject_transform")
	tw.pub("t.x.y", []byte("4"))
	tw.pub("t.z", []byte("5"))
	tw.sameConfigKeys("update without", tw.apiRaw("$JS.API.STREAM.UPDATE.T", `{"name":"T","subjects":["t.>"]}`), "subject_transform")
	tw.pub("t.a.b", []byte("6"))
	tw.sameStored("T")

	// ">" to ">" beside a transform of the only subject republishes what the transform stores.
	tw.sameConfigKeys("implicit republish", tw.apiRaw(create+"TI", `{"name":"TI","subjects":["ti.>"],"subject_transform":{"src":"ti.>","dest":"to.>"},"republish":{"src":">","dest":">"}}`), "subject_transform", "republish")
	tw.streams = append(tw.streams, "TI")
	subs := tw.republished("to.>")
	tw.pub("ti.a", []byte("x"))
	if m := tw.nextRepublished("implicit republish", subs, "TI"); m.Subject != "to.a" || m.Header.Get(jetstream.SubjectHeader) != "to.a" {
		t.Fatalf("implicit republish: %s, Nats-Subject %q", m.Subject, m.Header.Get(jetstream.SubjectHeader))
	}
	tw.compareAll("subject transforms")
}
