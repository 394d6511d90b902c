package bridge

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/internal/jstwin"
)

// A bridge in a JetStream domain names it where a JetStream server in that domain does:
// PubAcks (duplicates too), stream create, info and list, account info. Without a domain
// neither names one.
func TestDomainTwin(t *testing.T) {
	t.Parallel()
	for _, domain := range []string{"pg", ""} {
		t.Run("domain="+domain, func(t *testing.T) {
			t.Parallel()
			tb := setup(t, setupOpts{config: func(c *Config) { c.Domain = domain }})
			ref := startJetStreamWith(t, jstwin.Config{Domain: domain})
			sides := [2]*nats.Conn{tb.nc, ref.Conn()}

			// ask sends the same request to both sides and returns both answers, decoded.
			ask := func(subject string, hdr nats.Header, body string) [2]map[string]any {
				t.Helper()
				var got [2]map[string]any
				for i, nc := range sides {
					m, err := nc.RequestMsg(&nats.Msg{Subject: subject, Header: hdr, Data: []byte(body)}, 10*time.Second)
					if err != nil {
						t.Fatalf("%s: %s: %v", sideName[i], subject, err)
					}
					if err := json.Unmarshal(m.Data, &got[i]); err != nil {
						t.Fatalf("%s: %s: %q: %v", sideName[i], subject, m.Data, err)
					}
					if e, ok := got[i]["error"]; ok {
						t.Fatalf("%s: %s: %v", sideName[i], subject, e)
					}
				}
				return got
			}
			same := func(what string, ours, theirs any) {
				t.Helper()
				if !reflect.DeepEqual(ours, theirs) {
					t.Errorf("%s: jetgres %v, JetStream %v", what, ours, theirs)
				}
			}

			r := ask("$JS.API.STREAM.CREATE.D", nil, `{"name":"D","subjects":["d.>"]}`)
			same("stream create domain", r[0]["domain"], r[1]["domain"])
			id := nats.Header{"Nats-Msg-Id": []string{"one"}}
			for _, what := range []string{"PubAck", "duplicate PubAck"} {
				r = ask("d.x", id, "x")
				same(what, r[0], r[1])
			}
			r = ask("$JS.API.STREAM.UPDATE.D", nil, `{"name":"D","subjects":["d.>"],"max_msgs":10}`)
			same("stream update domain", r[0]["domain"], r[1]["domain"])
			r = ask("$JS.API.STREAM.INFO.D", nil, "")
			same("stream info domain", r[0]["domain"], r[1]["domain"])
			r = ask("$JS.API.STREAM.LIST", nil, "")
			var doms [2]any
			for i := range r {
				doms[i] = r[i]["streams"].([]any)[0].(map[string]any)["domain"]
			}
			same("stream list domain", doms[0], doms[1])
			r = ask("$JS.API.INFO", nil, "")
			same("account info domain", r[0]["domain"], r[1]["domain"])
			if got := r[1]["domain"]; domain != "" && got != domain {
				t.Fatalf("JetStream's account info reports domain %v, want %q: the reference is not in the domain", got, domain)
			}
		})
	}
}
