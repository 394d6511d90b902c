package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRepublishCLI makes a stream with a subject transform and a republish with the nats
// CLI, on a real JetStream and on jetgres, publishes to it with nats.go's jetstream package
// and reads what is republished with a plain subscription: the same subjects, headers and
// payloads, the same configuration as `nats stream info` shows it, and `nats stream edit`
// switching to headers only and then removing the republish.
func TestRepublishCLI(t *testing.T) {
	t.Parallel()
	servers := []natsServer{startJetStream(t), {name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}}
	var got [2][]string
	var info [2]string
	for i, s := range servers {
		natsAt(t, s, "stream", "add", "RP", "--subjects", "rp.>", "--defaults",
			"--transform-source", "rp.*.*", "--transform-destination", "st.{{wildcard(2)}}.{{wildcard(1)}}",
			"--republish-source", "st.>", "--republish-destination", "out.>")
		nc := connectURL(t, s.url)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := nc.SubscribeSync("out.>")
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		publish := func(subject, data string) {
			t.Helper()
			if _, err := js.Publish(ctx, subject, []byte(data)); err != nil {
				t.Fatalf("%s: publish %s: %v", s.name, subject, err)
			}
		}
		next := func(what string) {
			t.Helper()
			m, err := sub.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("%s: %s: %v", s.name, what, err)
			}
			got[i] = append(got[i], republishedText(m))
		}
		publish("rp.a.b", "one")
		next("first")
		publish("rp.a.b", "two")
		next("second of its subject")
		publish("rp.c.d", "three")
		next("another subject")
		natsAt(t, s, "stream", "edit", "RP", "--republish-source", "st.>", "--republish-destination", "out.>", "--republish-headers", "-f")
		publish("rp.a.b", "four")
		next("headers only")
		natsAt(t, s, "stream", "edit", "RP", "--no-republish", "-f")
		publish("rp.a.b", "not republished")
		natsAt(t, s, "stream", "edit", "RP", "--republish-source", "st.c.>", "--republish-destination", "out.again.>", "-f")
		publish("rp.a.b", "outside the source")
		publish("rp.e.c", "five")
		next("back")
		var si struct {
			Config struct {
				Transform json.RawMessage `json:"subject_transform"`
				Republish json.RawMessage `json:"republish"`
			} `json:"config"`
			State struct {
				Msgs uint64 `json:"messages"`
			} `json:"state"`
		}
		if err := json.Unmarshal([]byte(natsAt(t, s, "stream", "info", "RP", "--json")), &si); err != nil {
			t.Fatalf("%s: stream info: %v", s.name, err)
		}
		info[i] = fmt.Sprintf("%s %s %d", si.Config.Transform, si.Config.Republish, si.State.Msgs)
		_ = sub.Unsubscribe()
	}
	if strings.Join(got[0], "\n") != strings.Join(got[1], "\n") {
		t.Errorf("republished messages differ:\n--- jetstream\n%s\n--- jetgres\n%s", strings.Join(got[0], "\n"), strings.Join(got[1], "\n"))
	}
	if info[0] != info[1] {
		t.Errorf("stream info differs:\njetstream %s\njetgres   %s", info[0], info[1])
	}
}

// republishedText is a republished message as text, its time stamp left out: each server
// stored the message at its own time.
func republishedText(m *nats.Msg) string {
	h := m.Header
	return fmt.Sprintf("%s stream=%s subject=%s seq=%s last=%s size=%q data=%q time-set=%t", m.Subject,
		h.Get(jetstream.StreamHeader), h.Get(jetstream.SubjectHeader), h.Get(jetstream.SequenceHeader),
		h.Get(jetstream.LastSequenceHeader), h.Get("Nats-Msg-Size"), m.Data, h.Get(jetstream.TimeStampHeaer) != "")
}
