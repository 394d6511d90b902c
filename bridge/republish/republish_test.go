package republish

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The headers are nats-server's bytes: its format strings, copied from processJetStreamMsg,
// with and without headers of the message's own, with and without headers_only.
func TestHeadersAreNATSServers(t *testing.T) {
	const ht = "NATS/1.0\r\nNats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\nNats-Last-Sequence: %d\r\n\r\n"
	const htho = "NATS/1.0\r\nNats-Stream: %s\r\nNats-Subject: %s\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %s\r\nNats-Last-Sequence: %d\r\nNats-Msg-Size: %d\r\n\r\n"
	const hoff = 10
	ts := time.Date(2026, 12, 7, 18, 1, 2, 345600000, time.UTC)
	tsStr := ts.Format(time.RFC3339Nano)
	own := []byte("NATS/1.0\r\nOwn: x\r\n\r\n")
	for _, c := range []struct {
		name        string
		hdr         []byte
		headersOnly bool
		want        string
	}{
		{"plain", nil, false, fmt.Sprintf(ht, "S", "a.b", 7, tsStr, 3)},
		{"plain, headers only", nil, true, fmt.Sprintf(htho, "S", "a.b", 7, tsStr, 3, 5)},
		{"own headers", own, false, string(own[:len(own)-2]) + fmt.Sprintf(ht[hoff:], "S", "a.b", 7, tsStr, 3)},
		{"own headers, headers only", own, true, string(own[:len(own)-2]) + fmt.Sprintf(htho[hoff:], "S", "a.b", 7, tsStr, 3, 5)},
	} {
		m := pg.Message{Seq: 7, TS: ts.UnixNano(), Subject: "a.b", Header: c.hdr, Data: []byte("hello")}
		if got := string(headers(nil, &m, "S", 3, c.headersOnly)); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

// heldLink takes messages only once released, so that the sending goroutine waits in it.
type heldLink struct {
	mu      sync.Mutex
	release chan struct{}
	sent    []string
	entered chan struct{}
}

func (*heldLink) QueueGroups(_ string, dst []string) []string { return dst }

func (l *heldLink) PublishQueues(subject, _ string, _ []string, _, _ []byte) error {
	select {
	case l.entered <- struct{}{}:
	default:
	}
	<-l.release
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent = append(l.sent, subject)
	return nil
}

// What the queue cannot take while the goroutine waits on the link is dropped and counted,
// never waited for; what it took goes out in commit order, and Stop sends it all.
func TestQueueBoundDropsAndCounts(t *testing.T) {
	t.Parallel()
	db := pgtest.Open(t)
	link := &heldLink{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	reg := prometheus.NewRegistry()
	r := New(Config{Store: db, Link: link, Registerer: reg, QueueBytes: 4 * (headerRoom + 100)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	xf := stream.CompileTransforms(&server.StreamConfig{Subjects: []string{"in.>"}, RePublish: &server.RePublish{Source: "in.>", Destination: "out.>"}})
	msg := func(seq uint64) []pg.Message {
		return []pg.Message{{Seq: seq, TS: 1, Subject: fmt.Sprintf("in.%d", seq), Data: make([]byte, 100)}}
	}
	r.committed(1, "S", xf, msg(1))
	select {
	case <-link.entered:
	case <-ctx.Done():
		t.Fatal("the first message never reached the link")
	}
	for seq := uint64(2); seq <= 8; seq++ {
		r.committed(1, "S", xf, msg(seq))
	}
	if got := testutil.ToFloat64(r.m.dropped.WithLabelValues(reasonQueueFull)); got != 4 {
		t.Fatalf("dropped for a full queue: %v, want 4 (the first, in flight, counts till sent: the queue takes 3 of 7)", got)
	}
	r.committed(1, "S", stream.CompileTransforms(&server.StreamConfig{Subjects: []string{"in.>"}}), msg(9))
	close(link.release)
	r.Stop(ctx)
	if fmt.Sprint(link.sent) != "[out.1 out.2 out.3 out.4]" || testutil.ToFloat64(r.m.sent) != 4 {
		t.Fatalf("sent %d (counted %v), want the first and the 3 queued: %v", len(link.sent), testutil.ToFloat64(r.m.sent), link.sent)
	}
}

// A purge queues a reset only for a stream whose commits were queued: the others have no
// memory to reset, and most streams do not republish.
func TestPurgeQueuesOnlyForRepublishingStreams(t *testing.T) {
	t.Parallel()
	r := New(Config{Link: &heldLink{release: make(chan struct{})}})
	queued := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.queue)
	}
	r.purged(7, stream.Purged{First: 5})
	if n := queued(); n != 0 {
		t.Fatalf("a purge of a stream that never republished queued %d jobs, want none", n)
	}
	xf := stream.CompileTransforms(&server.StreamConfig{Subjects: []string{"in.>"}, RePublish: &server.RePublish{Source: "in.>", Destination: "out.>"}})
	r.committed(7, "S", xf, []pg.Message{{Seq: 1, TS: 1, Subject: "in.a"}})
	r.purged(7, stream.Purged{First: 5})
	if n := queued(); n != 2 {
		t.Fatalf("after a republished commit and a purge: %d jobs queued, want 2", n)
	}
	r.purged(8, stream.Purged{First: 5})
	if n := queued(); n != 2 {
		t.Fatalf("a purge of another stream queued a job: %d queued, want 2", n)
	}
}
