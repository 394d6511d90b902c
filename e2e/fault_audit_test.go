package e2e

// Helpers for the fault tests (fault_test.go) that read what a stream delivered and holds: a
// consuming client that records what it was given, and an audit of a stream's contents.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// consumerClient fetches from a durable pull consumer and acks everything, recording which
// message ids it was given and how often.
type consumerClient struct {
	stream, name string

	mu          sync.Mutex
	delivered   map[string]int
	deliveries  int
	redelivered int // deliveries the server marked as redeliveries (num_delivered > 1)
	roundFirst  []uint64
	lastAt      time.Time
	seqs        map[uint64]bool
}

func newConsumerClient(stream, name string) *consumerClient {
	return &consumerClient{stream: stream, name: name, delivered: make(map[string]int), seqs: make(map[uint64]bool)}
}

// run fetches and acks until ctx ends or the connection closes. The first stream sequence
// delivered in this run is recorded in roundFirst.
func (c *consumerClient) run(ctx context.Context, url string, pause time.Duration) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Name("consumer-"+c.name))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var cons jetstream.Consumer
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cons, err = js.Consumer(rctx, c.stream, c.name)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || nc.IsClosed() {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.mu.Lock()
	round := len(c.roundFirst)
	c.roundFirst = append(c.roundFirst, 0)
	c.mu.Unlock()
	for ctx.Err() == nil && !nc.IsClosed() {
		b, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			if m.Ack() != nil {
				break
			}
			c.mu.Lock()
			if c.roundFirst[round] == 0 {
				c.roundFirst[round] = md.Sequence.Stream
			}
			c.delivered[id]++
			c.deliveries++
			if md.NumDelivered > 1 {
				c.redelivered++
			}
			c.seqs[md.Sequence.Stream] = true
			c.lastAt = time.Now()
			c.mu.Unlock()
		}
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	return nil
}

// stats returns deliveries, distinct ids delivered, and ids delivered more than once.
func (c *consumerClient) stats() (deliveries, distinct, twice int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.delivered {
		if n > 1 {
			twice++
		}
	}
	return c.deliveries, len(c.delivered), twice
}

type auditResult struct {
	msgs      int // messages in the stream
	lost      int // acknowledged ids missing from the stream
	dupIDs    int // ids stored more than once
	wrongSeq  int // acknowledged ids stored at another sequence than their PubAck named
	foreign   int // messages without an id of these publishers
	firstSeq  uint64
	lastSeq   uint64
	seqToID   map[uint64]string
	idToSeqs  map[string][]uint64
	streamMsg uint64 // what stream info says
}

// auditStream reads every message of the stream in order through a consumer of its own
// (AckNone), checks that the sequences have no gap and that every acknowledged id is there
// exactly once at the sequence its PubAck named.
func auditStream(t testing.TB, ctx context.Context, js jetstream.JetStream, stream string, acked map[string]uint64) auditResult {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("audit %s: %v", stream, err)
	}
	info := s.CachedInfo()
	r := auditResult{firstSeq: info.State.FirstSeq, lastSeq: info.State.LastSeq, streamMsg: info.State.Msgs,
		seqToID: make(map[uint64]string), idToSeqs: make(map[string][]uint64)}
	if info.State.Msgs != info.State.LastSeq-info.State.FirstSeq+1 || info.State.NumDeleted != 0 {
		t.Errorf("audit %s: stream state %+v has gaps", stream, info.State)
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "AUDIT", AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatalf("audit %s: %v", stream, err)
	}
	next := r.firstSeq
	for next <= r.lastSeq && ctx.Err() == nil {
		b, err := c.Fetch(int(min(1000, r.lastSeq+1-next)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatalf("audit %s: %v", stream, err)
		}
		n := 0
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			if md.Sequence.Stream != next {
				t.Errorf("audit %s: got sequence %d, want %d (a gap)", stream, md.Sequence.Stream, next)
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			r.seqToID[md.Sequence.Stream] = id
			r.idToSeqs[id] = append(r.idToSeqs[id], md.Sequence.Stream)
			next = md.Sequence.Stream + 1
			n++
		}
		if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("audit %s: %v", stream, err)
		}
		if n == 0 {
			t.Fatalf("audit %s: nothing after sequence %d of %d", stream, next-1, r.lastSeq)
		}
	}
	r.msgs = len(r.seqToID)
	for id, seqs := range r.idToSeqs {
		if id == "" {
			r.foreign += len(seqs)
			continue
		}
		if len(seqs) > 1 {
			r.dupIDs++
			if r.dupIDs <= 5 {
				t.Errorf("audit %s: id %s stored %d times, at %v", stream, id, len(seqs), seqs)
			}
		}
	}
	for id, seq := range acked {
		seqs, ok := r.idToSeqs[id]
		switch {
		case !ok:
			r.lost++
			if r.lost <= 5 {
				t.Errorf("audit %s: acknowledged id %s (sequence %d) is not in the stream", stream, id, seq)
			}
		case seqs[0] != seq:
			r.wrongSeq++
			if r.wrongSeq <= 5 {
				t.Errorf("audit %s: id %s acknowledged as sequence %d, stored at %v", stream, id, seq, seqs)
			}
		}
	}
	if err := s.DeleteConsumer(ctx, "AUDIT"); err != nil {
		t.Errorf("audit %s: deleting the audit consumer: %v", stream, err)
	}
	return r
}

// ackedFor keeps the acknowledged ids of the publishers to one stream.
func ackedFor(pubs []*publisher, stream string) map[string]uint64 {
	var mine []*publisher
	for _, p := range pubs {
		if p.stream == stream {
			mine = append(mine, p)
		}
	}
	return ackedSeqs(mine)
}
