package bridge

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Every form of direct get, sent as raw requests to jetgres and to JetStream: both must
// answer with the same messages, headers and status lines (the time stamps aside, which
// must be there and parse).
func TestDirectGetMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "D", Subjects: []string{"d.>"}, AllowDirect: true})
	tw.createStream(jetstream.StreamConfig{Name: "ND", Subjects: []string{"nd.>"}})
	for side, js := range tw.js {
		for i, subj := range []string{"d.a", "d.b", "d.a", "d.c.x", "d.b", "d.a"} {
			m := nats.NewMsg(subj)
			m.Data = fmt.Appendf(nil, "m%d", i+1)
			if i%2 == 1 {
				m.Header.Set("X-Kind", "odd")
			}
			if _, err := js.PublishMsg(tw.ctx, m); err != nil {
				t.Fatalf("%s: %v", sideName[side], err)
			}
		}
		if err := js.DeleteStream(tw.ctx, "ND"); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(tw.ctx, jetstream.StreamConfig{Name: "ND", Subjects: []string{"nd.>"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(tw.ctx, "nd.a", nil); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		subject, body string
		many          bool // answered with several messages and an end-of-batch status
	}{
		{subject: "D", body: `{"seq":2}`},
		{subject: "D", body: `{"seq":99}`},
		{subject: "D", body: `{"seq":1,"no_hdr":true}`},
		{subject: "D", body: `{"last_by_subj":"d.b"}`},
		{subject: "D", body: `{"last_by_subj":"d.zz"}`},
		{subject: "D", body: `{"next_by_subj":"d.a","seq":2}`},
		{subject: "D", body: `{"next_by_subj":"d.*"}`},
		{subject: "D.d.a"},
		{subject: "D.d.c.x"},
		{subject: "D.d.*"},
		{subject: "D.d.nope"},
		{subject: "D"},
		{subject: "D", body: `{bad`},
		{subject: "D", body: `{}`},
		{subject: "D", body: `{"seq":1,"last_by_subj":"d.a"}`},
		{subject: "D.d.a", body: `{"seq":1}`},
		{subject: "D", body: `{"seq":2,"batch":3}`, many: true},
		{subject: "D", body: `{"next_by_subj":"d.a","batch":5}`, many: true},
		{subject: "D", body: `{"seq":5,"batch":10}`, many: true},
		{subject: "D", body: `{"multi_last":["d.*"]}`, many: true},
		{subject: "D", body: `{"multi_last":["d.>"],"up_to_seq":4}`, many: true},
		{subject: "D", body: `{"multi_last":["x.*"]}`},
		// max_bytes counts subject, headers and payload and stops after the message that
		// reaches it: 5 bytes for each message without a header.
		{subject: "D", body: `{"seq":1,"batch":10,"max_bytes":1}`, many: true},
		{subject: "D", body: `{"seq":1,"batch":10,"max_bytes":6}`, many: true},
		{subject: "D", body: `{"seq":1,"batch":10,"max_bytes":40}`, many: true},
		{subject: "D", body: `{"seq":3,"batch":10,"max_bytes":10}`, many: true},
		{subject: "D", body: `{"next_by_subj":"d.a","batch":10,"max_bytes":6}`, many: true},
		{subject: "D", body: `{"multi_last":["d.>"],"max_bytes":6}`, many: true},
		{subject: "D", body: `{"multi_last":["d.>"],"seq":5}`, many: true},
		{subject: "D", body: `{"multi_last":["d.>"],"batch":1}`, many: true},
		{subject: "D", body: `{"multi_last":["d.>"],"seq":99}`, many: true},
		{subject: "ND", body: `{"seq":1}`},
		{subject: "NOPE", body: `{"seq":1}`},
	}
	for _, c := range cases {
		var got [2][]string
		for side, js := range tw.js {
			got[side] = directAnswers(t, js.Conn(), "$JS.API.DIRECT.GET."+c.subject, c.body, c.many)
		}
		if !slices.Equal(got[ours], got[theirs]) {
			t.Errorf("DIRECT.GET.%s %s:\n jetgres   %q\n JetStream %q", c.subject, c.body, got[ours], got[theirs])
		}
	}
}

// directAnswers sends a raw direct get and describes each answer: status, headers (the time
// stamp only checked) and payload. It reads until an end-of-batch or error status when many.
func directAnswers(t *testing.T, nc *nats.Conn, subject, body string, many bool) []string {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, []byte(body)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			return append(out, "no answer: "+err.Error())
		}
		var parts []string
		for k, vs := range m.Header {
			if k == "Nats-Time-Stamp" {
				if _, err := time.Parse(time.RFC3339Nano, vs[0]); err != nil {
					parts = append(parts, "bad time stamp "+vs[0])
				}
				continue
			}
			parts = append(parts, k+"="+strings.Join(vs, ","))
		}
		slices.Sort(parts)
		out = append(out, strings.Join(parts, " ")+" data="+string(m.Data))
		if !many || m.Header.Get("Status") != "" {
			return out
		}
	}
}
