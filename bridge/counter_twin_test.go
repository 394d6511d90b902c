package bridge

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// incrMsg is a counter increment of subject by v, with any other headers as key, value pairs.
func incrMsg(subject, v string, kv ...string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(server.JSMessageIncr, v)
	for i := 0; i+1 < len(kv); i += 2 {
		m.Header.Set(kv[i], kv[i+1])
	}
	return m
}

// sameStored fails unless every message of stream, headers and all, is the same on both
// sides.
func (tw *twin) sameStored(stream string) {
	tw.t.Helper()
	st := tw.state(stream)
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		var raw [2]string
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, stream)
			if err != nil {
				tw.t.Fatal(err)
			}
			m, err := s.GetMsg(tw.ctx, seq)
			if errCode(tw.t, side, err) == jetstream.JSErrCodeMessageNotFound {
				raw[side] = "deleted"
				continue
			}
			// A direct get adds the store time, which differs by nature.
			delete(m.Header, "Nats-Time-Stamp")
			raw[side] = fmt.Sprintf("%s %v %q", m.Subject, m.Header, m.Data)
		}
		if raw[ours] != raw[theirs] {
			tw.t.Fatalf("message %d:\njetgres   %s\njetstream %s", seq, raw[ours], raw[theirs])
		}
	}
}

// A counter stream is created, refused and updated as nats-server does it; each increment
// is answered with the same PubAck bytes, "val" included, or the same error, in
// nats-server's order of checks; what is stored, {"val":"<total>"} under the published
// headers, is the same; a delete or a purge of a subject's last message leaves the one
// before it, or nothing, to add to.
func TestCounterTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	for _, c := range []struct{ name, cfg string }{
		{"discard new", `"discard":"new"`},
		{"work queue", `"retention":"workqueue"`},
		{"interest", `"retention":"interest"`},
	} {
		got := tw.apiRaw("$JS.API.STREAM.CREATE.BAD", `{"name":"BAD","subjects":["bad.>"],"allow_msg_counter":true,`+c.cfg+`}`)
		if !reflect.DeepEqual(got[ours]["error"], got[theirs]["error"]) || got[ours]["error"] == nil {
			t.Fatalf("%s:\njetgres   %v\njetstream %v", c.name, got[ours]["error"], got[theirs]["error"])
		}
	}
	cfg := jetstream.StreamConfig{Name: "CTR", Subjects: []string{"ctr.>"}, AllowMsgCounter: true, AllowDirect: true}
	tw.createStream(cfg)
	got := tw.apiRaw("$JS.API.STREAM.UPDATE.CTR", `{"name":"CTR","subjects":["ctr.>"],"allow_direct":true}`)
	if !reflect.DeepEqual(got[ours]["error"], got[theirs]["error"]) || got[ours]["error"] == nil {
		t.Fatalf("turning counters off:\njetgres   %v\njetstream %v", got[ours]["error"], got[theirs]["error"])
	}
	cfg.Description = "counters"
	tw.updateStream(cfg)

	pub := func(what string, m *nats.Msg) string { t.Helper(); return string(tw.pubRaw(what, m)) }
	for _, c := range []struct {
		what string
		msg  *nats.Msg
		want string
	}{
		{"first", incrMsg("ctr.a", "1"), `"val":"1"`},
		{"second", incrMsg("ctr.a", "41"), `"val":"42"`},
		{"negative", incrMsg("ctr.a", "-50"), `"val":"-8"`},
		{"plus sign", incrMsg("ctr.a", "+8"), `"val":"0"`},
		{"big", incrMsg("ctr.b", "123456789012345678901234567890"), `"val":"123456789012345678901234567890"`},
		{"bigger", incrMsg("ctr.b", "876543210987654321098765432110"), `"val":"1000000000000000000000000000000"`},
		{"zero", incrMsg("ctr.c", "0"), `"val":"0"`},
		{"not a number", incrMsg("ctr.a", "one"), "10171"},
		{"a fraction", incrMsg("ctr.a", "1.5"), "10171"},
		{"with a body", &nats.Msg{Subject: "ctr.a", Header: incrMsg("", "1").Header, Data: []byte("x")}, "10170"},
		{"without increment", &nats.Msg{Subject: "ctr.a", Data: []byte("x")}, "10169"},
		{"without increment or body", &nats.Msg{Subject: "ctr.a", Header: nats.Header{"X": {"y"}}}, "10169"},
		{"with a rollup", incrMsg("ctr.a", "1", server.JSMsgRollup, server.JSMsgRollupSubject), "10171"},
		{"with an expected stream", incrMsg("ctr.a", "1", server.JSExpectedStream, "CTR"), "10171"},
		{"with an expected last sequence", incrMsg("ctr.a", "1", server.JSExpectedLastSeq, "7"), "10171"},
		{"with an expected subject sequence", incrMsg("ctr.a", "1", server.JSExpectedLastSubjSeq, "1"), "10171"},
		{"with an expected last msg id", incrMsg("ctr.a", "1", server.JSExpectedLastMsgId, "m"), "10171"},
		{"with a ttl", incrMsg("ctr.a", "1", server.JSMessageTTL, "1m"), "10166"},
		{"missing after a wrong last sequence", &nats.Msg{Subject: "ctr.a", Header: nats.Header{server.JSExpectedLastSeq: {"1"}}}, "10071"},
		{"with a message id", incrMsg("ctr.a", "3", server.JSMsgId, "m1"), `"val":"3"`},
		{"with other headers", incrMsg("ctr.d", "2", "Trace", "t1"), `"val":"2"`},
		{"with sources", incrMsg("ctr.e", "1", server.JSMessageCounterSources, `{"S":{"ctr.e":"4"},"R":{"x":"1"}}`), `"val":"1"`},
		{"after sources", incrMsg("ctr.e", "2", server.JSMessageCounterSources, `{"T":{"y":"1"}}`), `"val":"3"`},
		{"with broken sources", incrMsg("ctr.f", "1", server.JSMessageCounterSources, "nope"), `"val":"1"`},
		{"after broken sources", incrMsg("ctr.f", "1"), "10172"},
	} {
		if ans := pub(c.what, c.msg); !strings.Contains(ans, c.want) {
			t.Fatalf("%s: %s, want %s", c.what, ans, c.want)
		}
	}
	// nats-server writes a duplicate's PubAck by hand, with a space jetgres leaves out.
	var dup [2]map[string]any
	for side, js := range tw.js {
		reply, err := js.Conn().RequestMsg(incrMsg("ctr.a", "3", server.JSMsgId, "m1"), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(reply.Data, &dup[side]); err != nil {
			t.Fatalf("%s: %q: %v", sideName[side], reply.Data, err)
		}
	}
	if !reflect.DeepEqual(dup[ours], dup[theirs]) || dup[ours]["duplicate"] != true {
		t.Fatalf("duplicate:\njetgres   %v\njetstream %v", dup[ours], dup[theirs])
	}

	ctr, err := tw.js[ours].Stream(tw.ctx, "CTR")
	if err != nil {
		t.Fatal(err)
	}
	last, err := ctr.GetLastMsgForSubject(tw.ctx, "ctr.d")
	if err != nil {
		t.Fatal(err)
	}
	if code := tw.deleteMsg("CTR", last.Sequence); code != 0 {
		t.Fatalf("delete: %d", code)
	}
	if ans := pub("after deleting the last", incrMsg("ctr.d", "5")); !strings.Contains(ans, `"val":"5"`) {
		t.Fatalf("after deleting the last: %s", ans)
	}
	if ans := pub("after deleting another subject's last", incrMsg("ctr.a", "1")); !strings.Contains(ans, `"val":"4"`) {
		t.Fatalf("after deleting the last: %s", ans)
	}
	tw.purge("CTR", jetstream.WithPurgeSubject("ctr.a"))
	if ans := pub("after a purge", incrMsg("ctr.a", "10")); !strings.Contains(ans, `"val":"10"`) {
		t.Fatalf("after a purge: %s", ans)
	}
	tw.sameStored("CTR")
	tw.compareAll("counters")

	// An atomic batch of increments adds them up in order, and answers with the batch's PubAck.
	tw.createStream(jetstream.StreamConfig{Name: "CAB", Subjects: []string{"cab.>"}, AllowMsgCounter: true, AllowAtomicPublish: true})
	pub("before the batch", incrMsg("cab.a", "1"))
	for i, commit := range []string{"", "", "1"} {
		m := batchMsg("cab.a", "inc", i+1, commit, server.JSMessageIncr, strconv.Itoa(10*(i+1)))
		m.Data = nil
		pub(fmt.Sprintf("increment %d of a batch", i+1), m)
	}
	refused := batchMsg("cab.a", "bad", 1, "", server.JSMessageIncr, "1")
	refused.Data = nil
	pub("a batch with a message without increment, message 1", refused)
	pub("a batch with a message without increment, message 2", batchMsg("cab.a", "bad", 2, "1"))
	if ans := pub("after the batches", incrMsg("cab.a", "1")); !strings.Contains(ans, `"val":"62"`) {
		t.Fatalf("after the batches: %s", ans)
	}
	tw.sameStored("CAB")

	tw.createStream(jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, AllowMsgCounter: true, MaxMsgSize: 40})
	pub("fits", incrMsg("small.a", "1"))
	pub("over max_msg_size once counted", incrMsg("small.a", "1000000000000000000000000000"))
	tw.sameStored("SMALL")
}

// Eight publishers incrementing one counter at once, through nats.go, sum exactly on both
// sides, and each sees a different total: every increment was added to the one before it.
func TestCounterConcurrentTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "HOT", Subjects: []string{"hot.>"}, AllowMsgCounter: true})
	const publishers, each = 8, 100
	for side, js := range tw.js {
		var mu sync.Mutex
		seen := make(map[string]bool)
		var wg sync.WaitGroup
		errs := make(chan error, publishers)
		for p := range publishers {
			wg.Go(func() {
				for i := range each {
					ack, err := js.PublishMsg(tw.ctx, incrMsg("hot.n", strconv.Itoa(1+(p+i)%3)))
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					seen[ack.Value] = true
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: %v", sideName[side], err)
		}
		s, err := js.Stream(tw.ctx, "HOT")
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetLastMsgForSubject(tw.ctx, "hot.n")
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		for p := range publishers {
			for i := range each {
				want += 1 + (p+i)%3
			}
		}
		var val server.CounterValue
		if err := json.Unmarshal(m.Data, &val); err != nil || val.Value != strconv.Itoa(want) {
			t.Fatalf("%s: total %q, want %d", sideName[side], m.Data, want)
		}
		if len(seen) != publishers*each {
			t.Fatalf("%s: %d distinct totals in %d PubAcks", sideName[side], len(seen), publishers*each)
		}
	}
}
