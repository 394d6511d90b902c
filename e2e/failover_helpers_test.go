package e2e

// Helpers for the failover tests (failover_test.go): publishers that send every message
// once and record its answer, a durable consumer that records every delivery and its
// confirmed acks, and the stream as the database holds it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// answer is what one publish was answered, if anything.
type answer struct {
	sent   time.Time
	at     time.Time
	seq    uint64 // from the PubAck
	failed string // the error a definite failure was answered with
}

// onePub publishes asynchronously, each message once with an id of its own as its body,
// and records every answer: a PubAck, a failure, or none before its timeout. It never
// retries, so that a failure answered for a message the database stored shows as that id
// in the stream.
type onePub struct {
	name    string
	subject string
	timeout time.Duration

	mu       sync.Mutex
	stopped  bool
	next     int
	sentAt   map[string]time.Time // of the publishes not answered yet
	answers  map[string]answer
	timedOut int
	unsent   int // refused by the client itself, its window full
}

func newOnePub(name, subject string) *onePub {
	return &onePub{name: name, subject: subject, timeout: 2 * time.Second, sentAt: make(map[string]time.Time), answers: make(map[string]answer)}
}

// run publishes until ctx ends, at most maxPending unanswered at a time, then waits up to
// drain for the answers still outstanding.
func (p *onePub) run(ctx context.Context, url string, maxPending int, drain time.Duration) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Name(p.name))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncTimeout(p.timeout),
		jetstream.WithPublishAsyncAckHandler(p.onAck),
		jetstream.WithPublishAsyncErrHandler(p.onErr))
	if err != nil {
		return err
	}
	for ctx.Err() == nil && !nc.IsClosed() {
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			break
		}
		id := fmt.Sprintf("%s-%08d", p.name, p.next)
		p.next++
		p.sentAt[id] = time.Now()
		p.mu.Unlock()
		if _, err := js.PublishAsync(p.subject, []byte(id)); err != nil {
			// Not sent: the client's window stayed full. Nothing reached jetgres.
			p.mu.Lock()
			delete(p.sentAt, id)
			p.unsent++
			p.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(drain):
	}
	return nil
}

// outstanding is how many of a publisher's publishes wait for an answer or their timeout.
func (p *onePub) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sentAt)
}

// stopSending ends a publisher's new publishes; its run waits for the answers outstanding.
func (p *onePub) stopSending() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
}

func (p *onePub) onAck(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
	id := string(m.Data)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers[id] = answer{sent: p.sentAt[id], at: time.Now(), seq: ack.Sequence}
	delete(p.sentAt, id)
}

func (p *onePub) onErr(_ jetstream.JetStream, m *nats.Msg, err error) {
	id := string(m.Data)
	p.mu.Lock()
	defer p.mu.Unlock()
	sent := p.sentAt[id]
	delete(p.sentAt, id)
	if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		p.timedOut++
		return
	}
	p.answers[id] = answer{sent: sent, at: time.Now(), failed: err.Error()}
}

// pubTotals sums the publishers' answers.
type pubTotals struct {
	sent, acked, failed, timedOut, unsent int
}

func totals(pubs []*onePub) pubTotals {
	var t pubTotals
	for _, p := range pubs {
		p.mu.Lock()
		t.sent += p.next - p.unsent
		t.timedOut += p.timedOut
		t.unsent += p.unsent
		for _, a := range p.answers {
			if a.failed != "" {
				t.failed++
			} else {
				t.acked++
			}
		}
		p.mu.Unlock()
	}
	return t
}

// ackedSince counts the PubAcks that arrived after at.
func ackedSince(pubs []*onePub, at time.Time) int {
	n := 0
	for _, p := range pubs {
		p.mu.Lock()
		for _, a := range p.answers {
			if a.failed == "" && a.at.After(at) {
				n++
			}
		}
		p.mu.Unlock()
	}
	return n
}

// firstAckSince is when the first PubAck came to a publish sent after at; zero if none did.
// A PubAck that arrives after at may answer a commit made before it.
func firstAckSince(pubs []*onePub, at time.Time) time.Time {
	var first time.Time
	for _, p := range pubs {
		p.mu.Lock()
		for _, a := range p.answers {
			if a.failed == "" && a.sent.After(at) && (first.IsZero() || a.at.Before(first)) {
				first = a.at
			}
		}
		p.mu.Unlock()
	}
	return first
}

// allAnswers is every publisher's answers by id.
func allAnswers(pubs []*onePub) map[string]answer {
	out := make(map[string]answer)
	for _, p := range pubs {
		p.mu.Lock()
		for id, a := range p.answers {
			out[id] = a
		}
		p.mu.Unlock()
	}
	return out
}

// given is one message a consumer was given.
type given struct {
	at  time.Time
	seq uint64
	id  string
}

// ackingConsumer fetches from a durable pull consumer and acks every message, the last of
// each batch with a double ack. Acks on one connection are taken in order, so once the
// double ack is answered every ack the consumer sent before it is stored, and none of those
// messages may be delivered again: such a delivery is recorded as a regression. A message
// the consumer never received (a pull's answer that came after the client gave up on it)
// is not acked, and JetStream delivers it again after ack_wait, below the highest
// confirmed sequence: that is not a regression.
type ackingConsumer struct {
	stream, name string

	mu          sync.Mutex
	deliveries  []given
	floor       uint64              // the highest stream sequence a double ack confirmed
	confirmed   map[uint64]struct{} // every sequence whose ack a double ack confirmed
	regressions []string
}

func (c *ackingConsumer) run(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Name("consumer-"+c.name))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, c.stream, c.name)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		b, err := cons.Fetch(200, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		var last jetstream.Msg
		var lastSeq uint64
		var acked []uint64
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			seq := md.Sequence.Stream
			c.mu.Lock()
			c.deliveries = append(c.deliveries, given{at: time.Now(), seq: seq, id: string(m.Data())})
			if _, ok := c.confirmed[seq]; ok {
				c.regressions = append(c.regressions, fmt.Sprintf("seq %d delivered again after its ack was confirmed", seq))
			}
			c.mu.Unlock()
			if last != nil {
				_ = last.Ack()
			}
			last, lastSeq = m, seq
			acked = append(acked, seq)
		}
		if last == nil {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if last.DoubleAck(actx) == nil {
			c.mu.Lock()
			c.floor = max(c.floor, lastSeq)
			if c.confirmed == nil {
				c.confirmed = make(map[uint64]struct{})
			}
			for _, q := range acked {
				c.confirmed[q] = struct{}{}
			}
			c.mu.Unlock()
		}
		cancel()
	}
	return nil
}

// snapshot copies what the consumer recorded.
func (c *ackingConsumer) snapshot() (deliveries []given, floor uint64, regressions []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deliveries), c.floor, slices.Clone(c.regressions)
}

// storedIDs reads the stream as the database holds it: the id in each message's body by
// sequence, and the stream's last sequence.
func storedIDs(ctx context.Context, db *rawsql.Pool, stream string) (map[uint64]string, uint64, error) {
	out := make(map[uint64]string)
	var last int64
	// One snapshot for the messages and the last sequence: a commit between two reads would
	// show a last sequence whose messages the first read did not see.
	err := db.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
		if err := q.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
			return err
		}
		rows, err := q.Query(ctx, `SELECT seq, convert_from(data, 'UTF8') FROM jetgres.messages($1, 1) ORDER BY seq`, stream)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var seq int64
			var id string
			if err := rows.Scan(&seq, &id); err != nil {
				return err
			}
			out[uint64(seq)] = id
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return q.QueryRow(ctx, `SELECT st.last_seq FROM jetgres.stream_state st JOIN jetgres.streams s ON s.id = st.stream_id WHERE s.name = $1`, stream).Scan(&last)
	})
	return out, uint64(last), err
}

// readAll reads the whole stream through a new consumer of jetgres's, from the first
// sequence to last, by sequence.
func readAll(ctx context.Context, js jetstream.JetStream, stream string, last uint64) (map[uint64]string, error) {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]string)
	for {
		b, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return out, err
		}
		got, done := 0, false
		// The batch is read to its end, whatever it holds, so that its fetch ends.
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return out, err
			}
			out[md.Sequence.Stream] = string(m.Data())
			got++
			done = done || md.Sequence.Stream >= last
		}
		if done {
			return out, nil
		}
		if got == 0 {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if b.Error() != nil {
				return out, b.Error()
			}
		}
	}
}
