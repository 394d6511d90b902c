package e2e

// Helpers for the fault tests (fault_test.go) that publish: publishers that track every
// Nats-Msg-Id they send and retry what was not acknowledged, a probe that times one publish
// at a time, and what all of them were answered with.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// msgState is what a publisher knows about one of its message ids.
type msgState struct {
	sent    time.Time // the latest attempt
	ackedAt time.Time // zero until a PubAck came
	seq     uint64    // from the PubAck
	queued  bool      // waiting in the retry queue
}

type retryItem struct {
	id string
	at time.Time
}

// publisher publishes to one subject asynchronously with a Nats-Msg-Id on every message, as
// a careful client does: what is answered with an error, or not answered before its
// connection went away, is published again with the same id. A client with failures retries
// them before it starts new work, so a fault does not pile up new ids without end.
type publisher struct {
	name       string
	stream     string
	subject    string
	payload    int
	maxPending int
	backoff    time.Duration
	rate       atomic.Uint64 // publishes a second, retries included; 0 is as fast as acks allow
	// ackTimeout, when set, gives up on a PubAck after it and retries: with several replicas
	// a publish can die with another server than the client's, on a connection that lives.
	ackTimeout time.Duration

	mu        sync.Mutex
	finishing bool // no new ids, only retries
	stopped   bool // nothing more: no new ids, no retries
	msgs      map[string]*msgState
	retry     []retryItem
	next      int
	attempts  int
	acks      int
	dupAcks   int                   // PubAcks that said duplicate: an id stored before
	errs      map[int]int           // errors by JetStream err_code (0: not a JetStream error)
	maxErrIn  map[int]time.Duration // longest wait from publish to error, by err_code
	maxAckIn  time.Duration
	errTimes  []time.Time
	conflicts []string // an id acked with two different sequences
}

func newPublisher(name, stream, subject string, payload, maxPending int) *publisher {
	return &publisher{
		name: name, stream: stream, subject: subject, payload: payload, maxPending: maxPending,
		backoff:  100 * time.Millisecond,
		msgs:     make(map[string]*msgState),
		errs:     make(map[int]int),
		maxErrIn: make(map[int]time.Duration),
	}
}

// startPublishers runs every publisher on wg until ctx ends, each draining its answers for up
// to 10 s after, and fails t for any that stops on an error.
func startPublishers(t *testing.T, ctx context.Context, wg *sync.WaitGroup, url string, pubs []*publisher) {
	for _, p := range pubs {
		wg.Go(func() {
			if err := p.run(ctx, url, 10*time.Second); err != nil {
				t.Errorf("publisher %s: %v", p.name, err)
			}
		})
	}
}

// run publishes until ctx ends or the connection to url closes, then waits up to drain for
// the answers still outstanding. A run starts by queueing every id that has no PubAck yet,
// so that a run after a crash retries what the last one left unanswered.
func (p *publisher) run(ctx context.Context, url string, drain time.Duration) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Name(p.name))
	if err != nil {
		return err
	}
	defer nc.Close()
	opts := []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncMaxPending(p.maxPending),
		jetstream.WithPublishAsyncAckHandler(p.onAck),
		jetstream.WithPublishAsyncErrHandler(p.onErr),
	}
	if p.ackTimeout > 0 {
		opts = append(opts, jetstream.WithPublishAsyncTimeout(p.ackTimeout))
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return err
	}
	p.requeueUnanswered()
	start, sent, rate := time.Now(), 0, p.rate.Load()
	for ctx.Err() == nil && !nc.IsClosed() {
		if r := p.rate.Load(); r != rate {
			start, sent, rate = time.Now(), 0, r
		}
		if rate > 0 && float64(sent) >= float64(rate)*time.Since(start).Seconds() {
			time.Sleep(time.Millisecond)
			continue
		}
		id, ok := p.take(time.Now())
		if !ok {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		m := nats.NewMsg(p.subject)
		// A body of its own: nats.go publishes the message again on a retry, after this
		// loop has moved on.
		m.Data = make([]byte, p.payload)
		copy(m.Data, id)
		sent++
		if _, err := js.PublishMsgAsync(m, jetstream.WithMsgID(id)); err != nil {
			p.requeue(id, time.Now())
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	if !nc.IsClosed() {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(drain):
		}
	}
	return nil
}

// take returns the next id to publish: a retry that is due, else a new id if nothing
// waits for a retry.
func (p *publisher) take(now time.Time) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return "", false
	}
	if len(p.retry) > 0 {
		r := p.retry[0]
		if now.Before(r.at) {
			return "", false
		}
		p.retry = p.retry[1:]
		st := p.msgs[r.id]
		st.queued = false
		if !st.ackedAt.IsZero() {
			// Answered late by an earlier attempt.
			return p.takeLocked(now)
		}
		st.sent = now
		p.attempts++
		return r.id, true
	}
	return p.takeLocked(now)
}

func (p *publisher) takeLocked(now time.Time) (string, bool) {
	if len(p.retry) > 0 || p.finishing {
		return "", false
	}
	id := fmt.Sprintf("%s-%08d", p.name, p.next)
	p.next++
	p.msgs[id] = &msgState{sent: now}
	p.attempts++
	return id, true
}

func (p *publisher) requeue(id string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requeueLocked(id, at)
}

func (p *publisher) requeueLocked(id string, at time.Time) {
	st := p.msgs[id]
	if st == nil || st.queued || !st.ackedAt.IsZero() {
		return
	}
	st.queued = true
	p.retry = append(p.retry, retryItem{id: id, at: at})
}

// requeueUnanswered queues every id without a PubAck, oldest first.
func (p *publisher) requeueUnanswered() {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0)
	for id, st := range p.msgs {
		if st.ackedAt.IsZero() && !st.queued {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	now := time.Now()
	for _, id := range ids {
		p.requeueLocked(id, now)
	}
}

func msgIDOf(m *nats.Msg) string {
	if m == nil || m.Header == nil {
		return ""
	}
	return m.Header.Get(jetstream.MsgIDHeader)
}

func (p *publisher) onAck(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
	id := msgIDOf(m)
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.msgs[id]
	if st == nil {
		return
	}
	if !st.ackedAt.IsZero() {
		if st.seq != ack.Sequence {
			p.conflicts = append(p.conflicts, fmt.Sprintf("%s acked as %d and as %d", id, st.seq, ack.Sequence))
		}
		return
	}
	st.ackedAt, st.seq = now, ack.Sequence
	p.acks++
	if ack.Duplicate {
		p.dupAcks++
	}
	p.maxAckIn = max(p.maxAckIn, now.Sub(st.sent))
}

func (p *publisher) onErr(_ jetstream.JetStream, m *nats.Msg, err error) {
	id := msgIDOf(m)
	now := time.Now()
	code := 0
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		code = int(apiErr.ErrorCode)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.msgs[id]
	if st == nil {
		return
	}
	p.errs[code]++
	p.errTimes = append(p.errTimes, now)
	p.maxErrIn[code] = max(p.maxErrIn[code], now.Sub(st.sent))
	p.requeueLocked(id, now.Add(p.backoff))
}

// probePublisher publishes one message at a time on a connection of its own, so that the
// time it waits for an answer is jetgres's, not a queue in its own client. Its messages carry
// ids of their own and are not retried.
type probePublisher struct {
	acks int
	errs []probeErr
}

// probeErr is one publish the probe sent at sent and got an error for after waited.
type probeErr struct {
	sent   time.Time
	waited time.Duration
}

// longestErrWait is the longest the probe waited for an error to a publish sent before to
// and answered after from: a publish that hangs across the whole span is sent before it.
func (p *probePublisher) longestErrWait(from, to time.Time) time.Duration {
	var d time.Duration
	for _, e := range p.errs {
		if e.sent.Before(to) && e.sent.Add(e.waited).After(from) {
			d = max(d, e.waited)
		}
	}
	return d
}

// run publishes to subject every 50 ms until ctx ends. A publish with no answer within
// its deadline, twenty statement timeouts, is an error: jetgres hung.
func (p *probePublisher) run(ctx context.Context, url, subject string, stmtTimeout time.Duration) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(0), nats.Name("probe"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for n := 0; ctx.Err() == nil; n++ {
		pctx, cancel := context.WithTimeout(context.Background(), 20*stmtTimeout)
		start := time.Now()
		_, err := js.Publish(pctx, subject, nil, jetstream.WithMsgID(fmt.Sprintf("probe-%d", n)))
		d := time.Since(start)
		cancel()
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			p.acks++
		case errors.As(err, &apiErr):
			p.errs = append(p.errs, probeErr{sent: start, waited: d})
		default:
			return fmt.Errorf("publish %d after %v: %w", n, d.Round(time.Millisecond), err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// pubSummary adds up a set of publishers.
type pubSummary struct {
	ids, acked, unacked, dupAcks, attempts int
	errs                                   map[int]int
	maxErrIn                               map[int]time.Duration
	maxAckIn                               time.Duration
	conflicts                              []string
}

func summarize(pubs []*publisher) pubSummary {
	s := pubSummary{errs: make(map[int]int), maxErrIn: make(map[int]time.Duration)}
	for _, p := range pubs {
		p.mu.Lock()
		s.ids += len(p.msgs)
		s.acked += p.acks
		s.dupAcks += p.dupAcks
		s.attempts += p.attempts
		for code, n := range p.errs {
			s.errs[code] += n
		}
		for code, d := range p.maxErrIn {
			s.maxErrIn[code] = max(s.maxErrIn[code], d)
		}
		s.maxAckIn = max(s.maxAckIn, p.maxAckIn)
		s.conflicts = append(s.conflicts, p.conflicts...)
		p.mu.Unlock()
	}
	s.unacked = s.ids - s.acked
	return s
}

// ackedSeqs returns every acknowledged id of the publishers with the sequence its PubAck
// named.
func ackedSeqs(pubs []*publisher) map[string]uint64 {
	out := make(map[string]uint64)
	for _, p := range pubs {
		p.mu.Lock()
		for id, st := range p.msgs {
			if !st.ackedAt.IsZero() {
				out[id] = st.seq
			}
		}
		p.mu.Unlock()
	}
	return out
}

// firstAckAfter returns the earliest PubAck received after t, or the zero time.
func firstAckAfter(pubs []*publisher, t time.Time) time.Time {
	var first time.Time
	for _, p := range pubs {
		p.mu.Lock()
		for _, st := range p.msgs {
			if st.ackedAt.After(t) && (first.IsZero() || st.ackedAt.Before(first)) {
				first = st.ackedAt
			}
		}
		p.mu.Unlock()
	}
	return first
}

// errorsBetween counts the errors the publishers were answered with in [from, to).
func errorsBetween(pubs []*publisher, from, to time.Time) int {
	n := 0
	for _, p := range pubs {
		p.mu.Lock()
		for _, e := range p.errTimes {
			if !e.Before(from) && e.Before(to) {
				n++
			}
		}
		p.mu.Unlock()
	}
	return n
}

// waitAllAcked stops the publishers taking new ids and keeps their retries going (they run
// until ctx ends) until every id they sent has its PubAck.
func waitAllAcked(t testing.TB, pubs []*publisher, timeout time.Duration) {
	t.Helper()
	for _, p := range pubs {
		p.mu.Lock()
		p.finishing = true
		p.mu.Unlock()
	}
	testwait.For(t, timeout, func() error {
		if s := summarize(pubs); s.unacked > 0 {
			return fmt.Errorf("%d of %d message ids still without a PubAck, e.g. %s", s.unacked, s.ids, unackedSample(pubs))
		}
		return nil
	})
}

// replayAcked publishes again, with the same id, the n acknowledged messages of each
// publisher that were acknowledged last, as a client does that cannot tell whether its
// acknowledgement arrived. Each must be answered as a duplicate at its first sequence.
// It returns how many were replayed.
func replayAcked(t testing.TB, ctx context.Context, js jetstream.JetStream, pubs []*publisher, n int) int {
	t.Helper()
	replayed := 0
	for _, p := range pubs {
		p.mu.Lock()
		type ackedID struct {
			id  string
			seq uint64
		}
		var all []ackedID
		for id, st := range p.msgs {
			if !st.ackedAt.IsZero() {
				all = append(all, ackedID{id, st.seq})
			}
		}
		p.mu.Unlock()
		slices.SortFunc(all, func(a, b ackedID) int { return int(b.seq) - int(a.seq) })
		for _, a := range all[:min(n, len(all))] {
			body := make([]byte, p.payload)
			copy(body, a.id)
			ack, err := js.Publish(ctx, p.subject, body, jetstream.WithMsgID(a.id))
			if err != nil {
				t.Fatalf("replaying %s: %v", a.id, err)
			}
			if !ack.Duplicate || ack.Sequence != a.seq {
				t.Errorf("replaying %s (sequence %d): answered sequence %d, duplicate %v", a.id, a.seq, ack.Sequence, ack.Duplicate)
			}
			replayed++
		}
	}
	return replayed
}

// stopPublishing makes the publishers send nothing more, not even retries; what they sent
// is still answered.
func stopPublishing(pubs []*publisher) {
	for _, p := range pubs {
		p.mu.Lock()
		p.stopped = true
		p.mu.Unlock()
	}
}

// unackedSample describes a few ids without a PubAck, for a failure message.
func unackedSample(pubs []*publisher) string {
	var out []string
	for _, p := range pubs {
		p.mu.Lock()
		for id, st := range p.msgs {
			if st.ackedAt.IsZero() && len(out) < 5 {
				out = append(out, fmt.Sprintf("%s (last sent %v ago, queued %v)", id, time.Since(st.sent).Round(time.Millisecond), st.queued))
			}
		}
		p.mu.Unlock()
	}
	return strings.Join(out, ", ")
}
