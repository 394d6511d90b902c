package bridge

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

// sendBatch publishes an atomic batch of n messages through nats.go on both sides of the
// twin: all but the last without a reply, as a publisher that does not wait for each
// message, the commit as a request whose answer it returns after comparing both sides'.
// bend changes message i before it is sent.
func (tw *twin) sendBatch(id string, n int, bend func(i int, m *nats.Msg)) []byte {
	tw.t.Helper()
	var got [2][]byte
	for side, js := range tw.js {
		nc := js.Conn()
		for i := 1; i <= n; i++ {
			commit := ""
			if i == n {
				commit = "1"
			}
			m := batchMsg(fmt.Sprintf("big.%d", i%10), id, i, commit)
			if bend != nil {
				bend(i, m)
			}
			if i < n {
				if err := nc.PublishMsg(m); err != nil {
					tw.t.Fatalf("%s: %v", sideName[side], err)
				}
				continue
			}
			reply, err := nc.RequestMsg(m, 30*time.Second)
			if err != nil {
				tw.t.Fatalf("%s: commit: %v", sideName[side], err)
			}
			got[side] = reply.Data
		}
	}
	if !bytes.Equal(got[ours], got[theirs]) {
		tw.t.Fatalf("batch %s:\njetgres   %s\njetstream %s", id, got[ours], got[theirs])
	}
	tw.compareAll("batch " + id)
	return got[ours]
}

// An atomic batch of 1,000 messages through nats.go is refused whole when one message
// breaks a rule, and stored whole once none does: one transaction, nothing of a refused
// batch left behind, on jetgres as on JetStream.
func TestAtomicBatchOfThousand(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "BIG", Subjects: []string{"big.>"}, AllowAtomicPublish: true})
	tw.pub("big.first", []byte("x"))
	const n = 1000

	held := uint64(1)
	refused := func(id string, bend func(i int, m *nats.Msg)) {
		t.Helper()
		ans := tw.sendBatch(id, n, bend)
		if !bytes.Contains(ans, []byte(`"error"`)) {
			t.Fatalf("batch %s stored: %s", id, ans)
		}
		if st := tw.state("BIG"); st.Msgs != held {
			t.Fatalf("batch %s refused, yet the stream holds %d messages", id, st.Msgs)
		}
	}
	refused("lastseq", func(i int, m *nats.Msg) {
		if i == 1 {
			m.Header.Set(server.JSExpectedLastSeq, "7")
		}
	})
	refused("subjseq", func(i int, m *nats.Msg) {
		if i == 500 {
			m.Header.Set(server.JSExpectedLastSubjSeq, "3")
			m.Header.Set(server.JSExpectedLastSubjSeqSubj, "big.first")
		}
	})
	tw.pub("big.first", []byte("y"))
	held++
	refused("duplicate", func(i int, m *nats.Msg) {
		if i == 999 || i == 3 {
			m.Header.Set(server.JSMsgId, "twice")
		}
	})

	ans := tw.sendBatch("whole", n, func(i int, m *nats.Msg) {
		switch i {
		case 1:
			m.Header.Set(server.JSExpectedLastSeq, "2")
		case 500:
			m.Header.Set(server.JSExpectedLastSubjSeq, "2")
			m.Header.Set(server.JSExpectedLastSubjSeqSubj, "big.first")
		}
	})
	if want := []byte(`"seq":1002,"batch":"whole","count":1000}`); !bytes.HasSuffix(ans, want) {
		t.Fatalf("commit answered %s, want ...%s", ans, want)
	}
	if st := tw.state("BIG"); st.Msgs != n+held || st.LastSeq != n+held {
		t.Fatalf("stream holds %d messages up to %d, want %d up to %d", st.Msgs, st.LastSeq, n+held, n+held)
	}
}

// A batch that gets no message for BatchTimeout is abandoned, on jetgres's clock: its next
// message finds it incomplete, and one that comes in time keeps it.
func TestAtomicBatchTimeout(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "BT", Subjects: []string{"bt.>"}, AllowAtomicPublish: true}); err != nil {
		t.Fatal(err)
	}
	send := func(id string, seq int, commit string) string {
		t.Helper()
		m, err := tb.nc.RequestMsg(batchMsg("bt.x", id, seq, commit), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(m.Data)
	}
	if got := send("slow", 1, ""); got != "" {
		t.Fatalf("staged message answered %q", got)
	}
	if got := send("kept", 1, ""); got != "" {
		t.Fatalf("staged message answered %q", got)
	}
	clock.Advance(9 * time.Second)
	if got := send("kept", 2, ""); got != "" {
		t.Fatalf("staged message answered %q", got)
	}
	clock.Advance(2 * time.Second)
	if got := send("slow", 2, "1"); !bytes.Contains([]byte(got), []byte(strconv.Itoa(int(server.JSAtomicPublishIncompleteBatchErr)))) {
		t.Fatalf("commit of an abandoned batch answered %s", got)
	}
	if got := send("kept", 3, "1"); got != `{"stream":"BT","seq":3,"batch":"kept","count":3}` {
		t.Fatalf("commit answered %s", got)
	}
	s, err := tb.js.Stream(context.Background(), "BT")
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.Msgs != 3 {
		t.Fatalf("stream holds %d messages, want 3", st.Msgs)
	}
}

// The batches staged at once are bounded per stream and in all, as nats-server bounds
// them, and batches abandoned on streams that see no more batches stop counting once they
// time out, whichever stream the next batch is for.
func TestAtomicBatchInflightLimits(t *testing.T) {
	t.Parallel()
	clock := clocktest.New()
	tb := setup(t, setupOpts{config: func(c *Config) { c.Clock = clock }})
	ctx := testContext(t)
	first := func(stream, id string) string {
		t.Helper()
		m, err := tb.nc.RequestMsg(batchMsg(stream+".x", id, 1, ""), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(m.Data)
	}
	tooMany := strconv.Itoa(int(server.JSAtomicPublishTooManyInflight))
	const streams = 21
	for i := range streams {
		name := fmt.Sprintf("IF%d", i)
		if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowAtomicPublish: true}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range streams - 1 {
		name := fmt.Sprintf("IF%d", i)
		for b := range 50 {
			if got := first(name, fmt.Sprintf("b%d", b)); got != "" {
				t.Fatalf("%s batch %d: %s", name, b, got)
			}
		}
		if i == 0 {
			if got := first(name, "one-too-many"); !strings.Contains(got, tooMany) {
				t.Fatalf("51st batch of a stream answered %s", got)
			}
		}
	}
	last := fmt.Sprintf("IF%d", streams-1)
	if got := first(last, "b"); !strings.Contains(got, tooMany) {
		t.Fatalf("1,001st batch answered %s", got)
	}
	clock.Advance(stream.BatchTimeout)
	if got := first(last, "b"); got != "" {
		t.Fatalf("a batch after the others timed out answered %s", got)
	}
}
