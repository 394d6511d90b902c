package bridge

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// batchMsg is one message of an atomic batch: id, its sequence in the batch, the commit
// header's value ("" for none) and any other headers as key, value pairs.
func batchMsg(subject, id string, seq int, commit string, kv ...string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = []byte(fmt.Sprintf("%s-%d", id, seq))
	m.Header.Set(server.JSBatchId, id)
	m.Header.Set(server.JSBatchSeq, strconv.Itoa(seq))
	if commit != "" {
		m.Header.Set(server.JSBatchCommit, commit)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Header.Set(kv[i], kv[i+1])
	}
	return m
}

// apiRaw sends an API request to both sides and returns both answers, decoded.
func (tw *twin) apiRaw(subject, body string) [2]map[string]any {
	tw.t.Helper()
	var got [2]map[string]any
	for side, js := range tw.js {
		m, err := js.Conn().Request(subject, []byte(body), 10*time.Second)
		if err != nil {
			tw.t.Fatalf("%s: %s: %v", sideName[side], subject, err)
		}
		if err := json.Unmarshal(m.Data, &got[side]); err != nil {
			tw.t.Fatalf("%s: %s: %q: %v", sideName[side], subject, m.Data, err)
		}
	}
	return got
}

// sameAtomicConfig fails unless both answers carry a config with the same allow_atomic and
// the same metadata but the API level each serves.
func (tw *twin) sameAtomicConfig(what string, got [2]map[string]any) {
	tw.t.Helper()
	var atomic [2]any
	var md [2]map[string]any
	for side := range got {
		if e, ok := got[side]["error"]; ok {
			tw.t.Fatalf("%s: %s: %v", sideName[side], what, e)
		}
		cfg, _ := got[side]["config"].(map[string]any)
		atomic[side] = cfg["allow_atomic"]
		md[side], _ = cfg["metadata"].(map[string]any)
		delete(md[side], server.JSServerLevelMetadataKey)
	}
	if atomic[ours] != atomic[theirs] || !maps.Equal(md[ours], md[theirs]) {
		tw.t.Fatalf("%s: allow_atomic jetgres %v, JetStream %v; metadata jetgres %v, JetStream %v",
			what, atomic[ours], atomic[theirs], md[ours], md[theirs])
	}
}

// Atomic batch publish as nats-server answers it: stream create, update and info with
// allow_atomic, the empty answers of staged messages, the commit's PubAck naming the batch,
// every refusal of the batch protocol and of its messages (each PubAck the same bytes), and
// what is stored: a refused batch leaves nothing behind.
func TestAtomicBatchTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)

	// Create without, update with: the required API level follows.
	tw.createStream(jetstream.StreamConfig{Name: "AB", Subjects: []string{"ab.>"}})
	tw.pubRaw("batch to a stream without allow_atomic", batchMsg("ab.a", "off", 1, "1"))
	tw.sameAtomicConfig("update", tw.apiRaw("$JS.API.STREAM.UPDATE.AB", `{"name":"AB","subjects":["ab.>"],"allow_atomic":true}`))
	tw.sameAtomicConfig("info", tw.apiRaw("$JS.API.STREAM.INFO.AB", ""))
	tw.sameAtomicConfig("create", tw.apiRaw("$JS.API.STREAM.CREATE.AC", `{"name":"AC","subjects":["ac.>"],"allow_atomic":true}`))
	tw.streams = append(tw.streams, "AC")
	r := tw.apiRaw("$JS.API.STREAM.CREATE.AD", `{"name":"AD","subjects":["ad.>"],"allow_atomic":true,"persist_mode":"async"}`)
	if fmt.Sprint(r[ours]["error"]) != fmt.Sprint(r[theirs]["error"]) || r[ours]["error"] == nil {
		t.Fatalf("atomic with async persistence: jetgres %v, JetStream %v", r[ours]["error"], r[theirs]["error"])
	}

	tw.pub("ab.first", []byte("x"))
	// pubs publishes a batch on both sides, message by message, comparing every answer.
	pubs := func(what string, msgs ...*nats.Msg) string {
		t.Helper()
		var last []byte
		for i, m := range msgs {
			last = tw.pubRaw(fmt.Sprintf("%s, message %d", what, i+1), m)
		}
		tw.compareAll(what)
		return string(last)
	}
	if got := pubs("batch of three", batchMsg("ab.a", "b3", 1, ""), batchMsg("ab.b", "b3", 2, ""), batchMsg("ab.a", "b3", 3, "1")); !strings.Contains(got, `"batch":"b3","count":3`) {
		t.Fatalf("commit answered %s", got)
	}
	pubs("end of batch", batchMsg("ab.a", "eob", 1, ""), batchMsg("ab.c", "eob", 2, ""), batchMsg("ab.x", "eob", 3, "eob"))
	pubs("commit of one", batchMsg("ab.a", "one", 1, "1"))
	pubs("gap", batchMsg("ab.a", "gap", 1, ""), batchMsg("ab.a", "gap", 3, "1"))
	pubs("gap abandons", batchMsg("ab.a", "gap", 2, "1"))
	pubs("not started", batchMsg("ab.a", "late", 2, "1"))
	pubs("not started, too large", batchMsg("ab.a", "huge", 1001, "1"))
	pubs("end of batch first", batchMsg("ab.a", "e1", 1, "eob"))
	pubs("no sequence", &nats.Msg{Subject: "ab.a", Header: nats.Header{server.JSBatchId: {"noseq"}}})
	pubs("sequence not a number", batchMsg("ab.a", "nan", 1, "", server.JSBatchSeq, "one"))
	pubs("id too long", batchMsg("ab.a", strings.Repeat("i", 65), 1, "1"))
	pubs("commit value", batchMsg("ab.a", "cv", 1, ""), batchMsg("ab.a", "cv", 2, "yes"))
	pubs("api level", batchMsg("ab.a", "lvl", 1, "", server.JSRequiredApiLevel, "99"))
	pubs("api level met", batchMsg("ab.a", "lvl2", 1, "1", server.JSRequiredApiLevel, "1"))
	pubs("wrong last sequence", batchMsg("ab.a", "els", 1, "", server.JSExpectedLastSeq, "1"), batchMsg("ab.a", "els", 2, "1"))
	st := tw.state("AB")
	last := strconv.FormatUint(st.LastSeq, 10)
	pubs("right last sequence", batchMsg("ab.a", "rls", 1, "", server.JSExpectedLastSeq, last), batchMsg("ab.a", "rls", 2, "1"))
	last = strconv.FormatUint(st.LastSeq+2, 10)
	pubs("last sequence after the first", batchMsg("ab.a", "ls2", 1, ""), batchMsg("ab.a", "ls2", 2, "1", server.JSExpectedLastSeq, last))
	pubs("subject sequence on a subject of the batch", batchMsg("ab.s", "ss", 1, ""), batchMsg("ab.t", "ss", 2, "1", server.JSExpectedLastSubjSeq, "0", server.JSExpectedLastSubjSeqSubj, "ab.s"))
	pubs("duplicate in the batch", batchMsg("ab.a", "dup", 1, "", server.JSMsgId, "m1"), batchMsg("ab.a", "dup", 2, "1", server.JSMsgId, "m1"))
	pubs("message id", batchMsg("ab.a", "mid", 1, "1", server.JSMsgId, "m2"))
	pubs("duplicate of the stream", batchMsg("ab.a", "dup2", 1, ""), batchMsg("ab.a", "dup2", 2, "1", server.JSMsgId, "m2"))
	pubs("expected last msg id", batchMsg("ab.a", "elm", 1, "", server.JSExpectedLastMsgId, "m2"), batchMsg("ab.a", "elm", 2, "1"))
	pubs("ttl in a batch", batchMsg("ab.a", "ttl", 1, ""), batchMsg("ab.a", "ttl", 2, "1", server.JSMessageTTL, "1m"))
	pubs("counter in a batch", batchMsg("ab.a", "inc", 1, "1", server.JSMessageIncr, "1"))
	pubs("rollup not permitted", batchMsg("ab.a", "ru", 1, "1", server.JSMsgRollup, server.JSMsgRollupSubject))
	pubs("expected stream", batchMsg("ab.a", "es", 1, "1", server.JSExpectedStream, "OTHER"))
	pubs("other stream's batch", batchMsg("ac.a", "b3", 1, "1"))

	// What is stored, headers and all, is the same.
	st = tw.state("AB")
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		var raw [2]string
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, "AB")
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.GetMsg(tw.ctx, seq)
			if err != nil {
				t.Fatalf("%s: get %d: %v", sideName[side], seq, err)
			}
			raw[side] = fmt.Sprintf("%s %v %q", m.Subject, m.Header, m.Data)
		}
		if raw[ours] != raw[theirs] {
			t.Fatalf("message %d:\njetgres   %s\njetstream %s", seq, raw[ours], raw[theirs])
		}
	}
}
