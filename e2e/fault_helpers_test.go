package e2e

// Helpers for the fault tests (fault_test.go): a PostgreSQL the test can stop and start,
// publishers that track every Nats-Msg-Id they send and retry what was not acknowledged,
// a consuming client that records what it was given, an audit of a stream's contents, and a
// sampler of /metrics, /readyz and the process's resident memory.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/embedded/localpg"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// soak reports whether the long variants run (JETGRES_SOAK=1).
func soak() bool { return os.Getenv("JETGRES_SOAK") == "1" }

// pgServer is a private PostgreSQL cluster that a test stops and starts under a running
// jetgres, which reaches it through --database-url.
type pgServer struct {
	t   testing.TB
	dir string

	mu sync.Mutex
	c  *localpg.Cluster // nil while stopped
}

// startPGServer starts a throwaway cluster, stopped when the test ends (after any jetgres
// started later, since cleanups run last-in first-out).
func startPGServer(t testing.TB) *pgServer {
	t.Helper()
	p := &pgServer{t: t, dir: filepath.Join(newDataDir(t), "pg")}
	if err := p.start(); err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("stopping the test PostgreSQL: %v", err)
		}
	})
	return p
}

func (p *pgServer) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := localpg.Start(ctx, localpg.Config{
		DataDir: p.dir,
		// The tests stop the server, never the machine.
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if err != nil {
		return err
	}
	p.c = c
	return nil
}

// stop makes a fast shutdown: connected clients are cut off and the socket goes away.
func (p *pgServer) stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := p.c.Stop(ctx)
	p.c = nil
	return err
}

// dsn is the cluster's connection string; it stays the same across stops and starts.
func (p *pgServer) dsn() string {
	return fmt.Sprintf("host=%s port=5432 user=%s dbname=%s sslmode=disable", p.dir, localpg.Superuser, localpg.Database)
}

// openProbe opens a small pool of the test's own on dsn, closed when the test ends.
func openProbe(t testing.TB, dsn string, conns int32) *rawsql.Pool {
	t.Helper()
	return rawsql.Open(t, fmt.Sprintf("%s application_name=e2e-probe pool_max_conns=%d", dsn, conns))
}

// storedFloor reads a consumer's persisted ack floor.
func storedFloor(ctx context.Context, db *rawsql.Pool, stream, consumer string) (uint64, error) {
	var seq int64
	err := db.QueryRow(ctx, `
		SELECT c.ack_stream_seq FROM jetgres.consumers c JOIN jetgres.streams s ON s.id = c.stream_id
		WHERE s.name = $1 AND c.name = $2`, stream, consumer).Scan(&seq)
	return uint64(seq), err
}

// ---------------------------------------------------------------------------------------
// Publishing with message ids.

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
		type acked struct {
			id  string
			seq uint64
		}
		var all []acked
		for id, st := range p.msgs {
			if !st.ackedAt.IsZero() {
				all = append(all, acked{id, st.seq})
			}
		}
		p.mu.Unlock()
		slices.SortFunc(all, func(a, b acked) int { return int(b.seq) - int(a.seq) })
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

// ---------------------------------------------------------------------------------------
// Consuming.

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

// ---------------------------------------------------------------------------------------
// Auditing a stream.

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

// ---------------------------------------------------------------------------------------
// Watching the process.

// parseMetrics reads Prometheus text exposition into "name{labels}" → value.
func parseMetrics(body string) map[string]float64 {
	out := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// metrics scrapes j's /metrics.
func (j *jetgres) metrics() (map[string]float64, error) {
	code, body, err := j.get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/metrics: %d", code)
	}
	return parseMetrics(body), nil
}

// vmRSS is a process's resident set size in bytes, from /proc.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// sample is one look at a running jetgres.
type sample struct {
	at        time.Time
	ready     int // /readyz status, 0 when it did not answer
	pushLimit float64
	popLimit  float64
	pushIn    float64 // push permits in flight
	pushBase  float64 // push lane rtt_base, seconds
	rejected  map[string]float64
	accepted  float64
	rss       int64
	heap      float64 // Go heap in use (go_memstats_heap_inuse_bytes)
	leafSlow  float64 // replies the leafnode link refused because its buffer was full
	// Flushes so far that took more than 256 and more than 1,024 messages from one stream's
	// intake (jetgres_fusion_batch_messages).
	over256, over1024 float64
}

// sampler watches a jetgres every period: /readyz, /metrics and VmRSS.
type sampler struct {
	j      *jetgres
	period time.Duration
	stopCh chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	samples []sample
}

func startSampler(j *jetgres, period time.Duration) *sampler {
	s := &sampler{j: j, period: period, stopCh: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *sampler) loop() {
	defer close(s.done)
	t := time.NewTicker(s.period)
	defer t.Stop()
	for {
		s.take()
		select {
		case <-s.stopCh:
			return
		case <-t.C:
		}
	}
}

func (s *sampler) take() {
	sm := sample{at: time.Now(), rejected: make(map[string]float64)}
	var wg sync.WaitGroup
	wg.Go(func() {
		if code, _, err := s.j.get("/readyz"); err == nil {
			sm.ready = code
		}
	})
	m, err := s.j.metrics()
	if err == nil {
		sm.pushLimit = m["jetgres_push_vegas_limit"]
		sm.popLimit = m["jetgres_pop_vegas_limit"]
		sm.pushIn = m["jetgres_push_vegas_in_flight"]
		sm.pushBase = m["jetgres_push_vegas_rtt_base_seconds"]
		sm.heap = m["go_memstats_heap_inuse_bytes"]
		sm.leafSlow = m["jetgres_leaf_slow_consumer_total"]
		sm.accepted = m["jetgres_publish_accepted_total"]
		flushes := m["jetgres_fusion_batch_messages_count"]
		sm.over256 = flushes - m[`jetgres_fusion_batch_messages_bucket{le="256"}`]
		sm.over1024 = flushes - m[`jetgres_fusion_batch_messages_bucket{le="1024"}`]
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, `jetgres_publish_rejected_total{reason="`); ok {
				sm.rejected[strings.TrimSuffix(r, `"}`)] = v
			}
		}
	}
	sm.rss, _ = vmRSS(s.j.cmd.Process.Pid)
	wg.Wait()
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
}

func (s *sampler) stop() []sample {
	close(s.stopCh)
	<-s.done
	return s.all()
}

func (s *sampler) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// between returns the samples taken in [from, to).
func between(ss []sample, from, to time.Time) []sample {
	var out []sample
	for _, s := range ss {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// limitRange is the smallest and largest push lane limit among samples that have one.
func limitRange(ss []sample) (lo, hi float64) {
	for _, s := range ss {
		if s.pushLimit == 0 {
			continue
		}
		if lo == 0 || s.pushLimit < lo {
			lo = s.pushLimit
		}
		hi = max(hi, s.pushLimit)
	}
	return lo, hi
}

func peakRSS(ss []sample) int64 {
	var p int64
	for _, s := range ss {
		p = max(p, s.rss)
	}
	return p
}

// limitTrace renders the push lane limit over time, two values a second, for the log.
func limitTrace(ss []sample, t0 time.Time) string {
	var b strings.Builder
	last := math.MinInt
	for _, s := range ss {
		slot := int(math.Floor(s.at.Sub(t0).Seconds() * 2))
		if slot == last || s.pushLimit == 0 {
			continue
		}
		last = slot
		fmt.Fprintf(&b, " %.1fs:%g(in %g, base %v)", float64(slot)/2, s.pushLimit, s.pushIn, time.Duration(s.pushBase*1e9).Round(time.Microsecond))
	}
	return b.String()
}

// rssTrace renders resident memory and the Go heap in use over time, one value a second,
// for the log.
func rssTrace(ss []sample, t0 time.Time) string {
	var b strings.Builder
	last := math.MinInt
	for _, s := range ss {
		sec := int(math.Floor(s.at.Sub(t0).Seconds()))
		if sec == last || s.rss == 0 {
			continue
		}
		last = sec
		fmt.Fprintf(&b, " %ds:%.0f/%.0f", sec, float64(s.rss)/(1<<20), s.heap/(1<<20))
	}
	return b.String() + " (MiB, RSS/heap in use)"
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
