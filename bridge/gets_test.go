package bridge

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// compareGets asks both sides every get that memory may answer: each sequence up to one
// past the last, the last of each subject (direct, by subject token and by STREAM.MSG.GET)
// and the next of a wildcard from each sequence. Both must answer alike.
func (tw *twin) compareGets(step, stream string, subjects []string) {
	tw.t.Helper()
	last := tw.state(stream).LastSeq
	type ask struct{ subject, body string }
	var asks []ask
	for seq := uint64(1); seq <= last+1; seq++ {
		asks = append(asks,
			ask{"$JS.API.DIRECT.GET." + stream, fmt.Sprintf(`{"seq":%d}`, seq)},
			ask{"$JS.API.DIRECT.GET." + stream, fmt.Sprintf(`{"seq":%d,"next_by_subj":"k.*"}`, seq)},
			ask{"$JS.API.STREAM.MSG.GET." + stream, fmt.Sprintf(`{"seq":%d}`, seq)})
	}
	for _, subj := range subjects {
		asks = append(asks,
			ask{"$JS.API.DIRECT.GET." + stream, fmt.Sprintf(`{"last_by_subj":%q}`, subj)},
			ask{"$JS.API.DIRECT.GET." + stream + "." + subj, ""},
			ask{"$JS.API.STREAM.MSG.GET." + stream, fmt.Sprintf(`{"last_by_subj":%q}`, subj)})
	}
	for _, a := range asks {
		var got [2]string
		for side, js := range tw.js {
			got[side] = getAnswer(tw.t, js.Conn(), a.subject, a.body)
		}
		if got[ours] != got[theirs] {
			tw.t.Errorf("%s: %s %s:\n jetgres   %s\n JetStream %s", step, a.subject, a.body, got[ours], got[theirs])
		}
	}
}

// getAnswer describes a get's answer: a direct get's as directAnswers does, STREAM.MSG.GET's
// message or error code.
func getAnswer(t *testing.T, nc *nats.Conn, subject, body string) string {
	t.Helper()
	if len(subject) < len("$JS.API.STREAM") || subject[:len("$JS.API.STREAM")] != "$JS.API.STREAM" {
		return fmt.Sprint(directAnswers(t, nc, subject, body, false))
	}
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		return "no answer: " + err.Error()
	}
	var resp struct {
		Error *struct {
			ErrCode int `json:"err_code"`
		} `json:"error"`
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Data    []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return "bad answer: " + string(m.Data)
	}
	if resp.Error != nil {
		return fmt.Sprintf("err_code %d", resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return "no message"
	}
	return fmt.Sprintf("%s #%d %q", resp.Message.Subject, resp.Message.Seq, resp.Message.Data)
}

// getCount reads jetgres_gets_total ("served", by where from) or
// jetgres_subject_index_lookups_total ("lookups", by result).
func getCount(t testing.TB, reg *prometheus.Registry, vec string, label string) float64 {
	t.Helper()
	name, key := "jetgres_gets_total", "from"
	if vec == "lookups" {
		name, key = "jetgres_subject_index_lookups_total", "result"
	}
	m, ok := series(t, reg, name, key, label)
	if !ok {
		t.Fatalf("no %s{%s=%q}", name, key, label)
	}
	return m.GetCounter().GetValue()
}

// Gets answered from memory must follow every way a message stops being there, as
// JetStream's do: replacement by max_msgs_per_subject (a key-value put), eviction by
// max_msgs, a delete, purges of a subject and of everything, a rollup.
func TestGetsFromMemoryFollowRemovals(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "KV", Subjects: []string{"k.>"}, AllowDirect: true, MaxMsgsPerSubject: 2, MaxMsgs: 8})
	subjects := []string{"k.a", "k.b", "k.c", "k.d"}
	for i, subj := range []string{"k.a", "k.b", "k.a", "k.c", "k.a"} {
		tw.pub(subj, fmt.Appendf(nil, "v%d", i))
	}
	tw.compareGets("replaced", "KV", subjects)
	for i, subj := range []string{"k.d", "k.b", "k.d", "k.c", "k.d", "k.b"} {
		tw.pub(subj, fmt.Appendf(nil, "w%d", i))
	}
	tw.compareGets("evicted by max_msgs", "KV", subjects)
	last := tw.state("KV").LastSeq
	tw.deleteMsg("KV", last) // the last of k.b: its revision before it is last again
	tw.compareGets("deleted", "KV", subjects)
	tw.purge("KV", jetstream.WithPurgeSubject("k.d"))
	tw.compareGets("purged k.d", "KV", subjects)
	tw.pub("k.d", []byte("back"))
	tw.compareGets("k.d again", "KV", subjects)
	tw.purge("KV")
	tw.compareGets("purged", "KV", subjects)
	tw.pub("k.a", []byte("after"))
	tw.pub("k.b", []byte("after"))
	tw.compareGets("after the purge", "KV", subjects)
	if n := getCount(t, tw.tb.reg, "served", "memory"); n == 0 {
		t.Error("no get was answered from memory")
	}
	if n := getCount(t, tw.tb.reg, "lookups", "hit"); n == 0 {
		t.Error("the subject index answered no last-by-subject get")
	}
}

// Interest and workqueue retention leave the tail as it was for the consumers: gets must
// not answer what they removed, at the front or in the middle.
func TestGetsFromMemoryFollowRetention(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "WQ", Subjects: []string{"k.*"}, Retention: jetstream.WorkQueuePolicy, AllowDirect: true})
	subjects := []string{"k.a", "k.b"}
	tw.pubN("k.a", 3, 4)
	tw.pubN("k.b", 3, 4)
	tw.compareGets("stored", "WQ", subjects)
	cons, _ := tw.consumer("WQ", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	msgs := tw.fetch(cons, 6)
	tw.ack(msgs, 1, 2)
	tw.want("WQ", 4, 3, 6, 0)
	tw.compareGets("front acked", "WQ", subjects)
	tw.ack(msgs, 4, 6)
	tw.want("WQ", 2, 3, 6, 2)
	tw.compareGets("middle acked", "WQ", subjects)
	tw.pub("k.b", nil)
	tw.compareGets("published again", "WQ", subjects)
}

// A direct get that memory answers is answered on the link's read loop: it waits for no
// API worker, even when every worker waits on the database and requests queue behind them.
// One that needs the database waits its turn, as every other request does.
func TestDirectGetsFromMemorySkipBusyWorkers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"r.a", "r.b"} {
		if _, err := tb.js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	newStream(t, ctx, tb, "BLOCK", "block.>")
	probe := rawsql.Open(t, tb.dbURL)
	release := probe.HoldRows(t, `SELECT 1 FROM jetgres.stream_state WHERE stream_id = $1 FOR UPDATE`, tb.bridge.streams.Lookup("BLOCK").ID())
	defer release()
	// Every worker takes a purge that waits on the held row; one more purge queues.
	for range APIWorkersDefault + 1 {
		if err := tb.nc.PublishRequest("$JS.API.STREAM.PURGE.BLOCK", tb.nc.NewRespInbox(), nil); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := tb.bridge.api.Queued(); n != 1 {
			return fmt.Errorf("%d requests queued for a worker, want 1", n)
		}
		return nil
	})
	for _, a := range []struct{ subject, body, want string }{
		{"$JS.API.DIRECT.GET.R", `{"seq":2}`, "r.b"},
		{"$JS.API.DIRECT.GET.R.r.a", "", "r.a"},
		{"$JS.API.DIRECT.GET.R", `{"last_by_subj":"r.b"}`, "r.b"},
		{"$JS.API.DIRECT.GET.R", `{"seq":1,"next_by_subj":"r.b"}`, "r.b"},
	} {
		m, err := tb.nc.Request(a.subject, []byte(a.body), 5*time.Second)
		if err != nil {
			t.Fatalf("%s %s with every worker busy: %v", a.subject, a.body, err)
		}
		if string(m.Data) != a.want {
			t.Errorf("%s %s: %q, want %q", a.subject, a.body, m.Data, a.want)
		}
	}
	if n := tb.bridge.api.Queued(); n != 1 {
		t.Fatalf("%d requests queued after the gets, want the 1 still waiting: the workers were not all busy", n)
	}
	// A sequence memory does not hold: past the last, which only the database can tell.
	late := make(chan *nats.Msg, 1)
	go func() {
		m, err := tb.nc.Request("$JS.API.DIRECT.GET.R", []byte(`{"seq":3}`), 10*time.Second)
		if err != nil {
			t.Error(err)
		}
		late <- m
	}()
	testwait.For(t, 10*time.Second, func() error {
		if n := tb.bridge.api.Queued(); n != 2 {
			return fmt.Errorf("%d requests queued, want 2: the get of a sequence memory does not hold", n)
		}
		return nil
	})
	release()
	if m := <-late; m == nil || m.Header.Get("Status") != "404" {
		t.Errorf("get past the last: %v, want 404", m)
	}
}
