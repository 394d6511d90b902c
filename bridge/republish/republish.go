package republish

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/clock"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/startstop"
	"github.com/jetgres/jetgres/internal/warnlog"
	"github.com/jetgres/jetgres/pg"
)

const (
	// QueueBytesDefault bounds the messages waiting to be republished: the bytes they will
	// take on the link.
	QueueBytesDefault = 64 << 20
	// SubjectsMax bounds the last sequences per subject kept for all streams together; a
	// stream whose subjects would pass it forgets its own and reads them again.
	SubjectsMax = 1 << 18
	// headerRoom is what a queued message counts for the headers republish adds to it.
	headerRoom = 160
	// lookupTimeout bounds one read of last sequences from PostgreSQL.
	lookupTimeout = 10 * time.Second
)

// Store reads what the republished headers need of PostgreSQL; *pg.DB is one.
type Store interface {
	LastSeqsBefore(ctx context.Context, streamID int64, subjects []string, from, before uint64) (map[string]uint64, error)
}

// QueueSender sends the republished messages without waiting; *leaf.Conn is one. The
// server hands a leafnode's message to the queue subscribers only of the groups it names: a
// message names those the server announced for its subject.
type QueueSender interface {
	QueueGroups(subject string, dst []string) []string
	PublishQueues(subject, reply string, queues []string, hdr, data []byte) error
}

// Config configures a Republisher. Store and Link are required.
type Config struct {
	Store      Store
	Link       QueueSender
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil registers nothing
	// QueueBytes bounds the queue; 0 means QueueBytesDefault.
	QueueBytes int
	// QueueGroup is the queue group of the streams' subscriptions, and Local takes a
	// message as a publish to a stream of this process (stream.Registry.PublishLocal):
	// a destination that a stream covers is stored by another replica when one has the
	// group's interest, and here otherwise. Local may be nil when no stream is served.
	QueueGroup string
	Local      func(subject string, hdr, data []byte) bool
}

// job is one commit's messages to republish, or, with no messages, a stream's purge
// (reset) or deletion (drop).
type job struct {
	id    int64
	name  string
	xf    *stream.Transforms
	msgs  []pg.Message
	bytes int
	reset bool
	floor uint64 // with reset, the stream's first sequence when the purger knew it
	drop  bool
	// done, with nothing else set, is closed once every job queued before it is done.
	done chan struct{}
}

// Republisher republishes what streams with a republish store; see the package comment.
type Republisher struct {
	cfg  Config
	m    *republishMetrics
	warn warnlog.Throttle

	mu    sync.Mutex // a leaf: guards queue, bytes and tracked
	queue []job
	bytes int
	kick  chan struct{}
	// tracked is the streams whose commits were queued since their last drop: only they
	// can have memory for a purge to reset or a deletion to drop, so the streams that do
	// not republish, most of them, queue nothing when purged or deleted.
	tracked map[int64]struct{}

	// streams is each republishing stream's memory of its subjects; only the goroutine
	// that sends touches it.
	streams  map[int64]*subjects
	subjects int // entries of every streams' last maps

	bg      startstop.Group
	started atomic.Bool
}

// subjects is what one stream's republished headers remember.
type subjects struct {
	// through is the last sequence of the last commit seen: last is right for a commit
	// that follows it.
	through uint64
	// floor is the lowest sequence a lookup may find: a purge request's new first sequence.
	floor uint64
	last  map[string]uint64
}

// New builds a Republisher; Start makes it send.
func New(cfg Config) *Republisher {
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = QueueBytesDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Clock = clock.OrSystem(cfg.Clock)
	r := &Republisher{cfg: cfg, kick: make(chan struct{}, 1), streams: make(map[int64]*subjects), tracked: make(map[int64]struct{})}
	r.m = newMetrics(cfg.Registerer, r)
	return r
}

// Start starts the goroutine that sends.
func (r *Republisher) Start(ctx context.Context) error {
	bctx, err := r.bg.Start(ctx)
	if err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	r.bg.Go(func() { r.run(bctx) })
	r.started.Store(true)
	return nil
}

// Stop sends what the queue holds, until ctx ends, and stops the goroutine.
func (r *Republisher) Stop(ctx context.Context) {
	if !r.started.Load() {
		r.bg.Stop()
		return
	}
	done := make(chan struct{})
	r.push(job{done: done})
	select {
	case <-done:
	case <-ctx.Done():
	}
	r.bg.Stop()
}

// OnCommitted queues the commit's messages when the stream republishes.
func (r *Republisher) OnCommitted(s *stream.Stream, ev stream.Committed) {
	r.committed(s.ID(), s.Name(), s.Transforms(), ev.Stored)
}

// committed queues msgs, stored in stream id under xf, when xf republishes; what the queue
// cannot take is dropped and counted.
func (r *Republisher) committed(id int64, name string, xf *stream.Transforms, msgs []pg.Message) {
	if !xf.Republishes() || len(msgs) == 0 {
		return
	}
	n := 0
	for i := range msgs {
		n += len(msgs[i].Header) + headerRoom
		if !xf.HeadersOnly() {
			n += len(msgs[i].Data)
		}
	}
	if !r.push(job{id: id, name: name, xf: xf, msgs: msgs, bytes: n}) {
		r.m.dropped.WithLabelValues(reasonQueueFull).Add(float64(len(msgs)))
	}
}

// OnPurged makes the stream's subjects be read again: a purge request, a delete or a
// promoted standby may have taken the last message of any of them.
func (r *Republisher) OnPurged(_ context.Context, s *stream.Stream, ev stream.Purged) {
	r.purged(s.ID(), ev)
}

// purged queues the reset of stream id's subjects for ev, when it has any.
func (r *Republisher) purged(id int64, ev stream.Purged) {
	if ev.ByCommit || ev.Consumed || !r.tracks(id, false) {
		return
	}
	r.push(job{id: id, reset: true, floor: ev.First})
}

// OnRemoved does nothing: what a stream's first sequence moved past still counts as a
// subject's last message until a commit replaces it, as it does at the moment nats-server
// stores the next one.
func (r *Republisher) OnRemoved(*stream.Stream, stream.Removed) {}

// OnDropped forgets the stream.
func (r *Republisher) OnDropped(s *stream.Stream, _ stream.Dropped) {
	if r.tracks(s.ID(), true) {
		r.push(job{id: s.ID(), drop: true})
	}
}

// tracks reports whether stream id is tracked, and stops tracking it when untrack is set.
func (r *Republisher) tracks(id int64, untrack bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.tracked[id]
	if ok && untrack {
		delete(r.tracked, id)
	}
	return ok
}

// push queues j within the bound; a job with no bytes always goes in.
func (r *Republisher) push(j job) bool {
	r.mu.Lock()
	if j.bytes > 0 && r.bytes > 0 && r.bytes+j.bytes > r.cfg.QueueBytes {
		r.mu.Unlock()
		return false
	}
	r.queue = append(r.queue, j)
	r.bytes += j.bytes
	if len(j.msgs) > 0 {
		r.tracked[j.id] = struct{}{}
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return true
}

func (r *Republisher) run(ctx context.Context) {
	for {
		r.mu.Lock()
		jobs := r.queue
		r.queue = nil
		r.mu.Unlock()
		for _, j := range jobs {
			r.do(ctx, j)
			r.mu.Lock()
			r.bytes -= j.bytes
			r.mu.Unlock()
		}
		if len(jobs) > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
	}
}

func (r *Republisher) do(ctx context.Context, j job) {
	st := r.streams[j.id]
	switch {
	case j.done != nil:
		close(j.done)
		return
	case j.drop:
		r.forget(j.id, st)
		return
	case j.reset:
		if st != nil {
			r.subjects -= len(st.last)
			clear(st.last)
			st.floor = max(st.floor, j.floor)
		}
		return
	case st == nil:
		st = &subjects{last: make(map[string]uint64)}
		r.streams[j.id] = st
	}
	first := j.msgs[0].Seq
	if st.through != first-1 {
		r.subjects -= len(st.last)
		clear(st.last)
	}
	r.lookup(ctx, j, st, first)
	hdr := make([]byte, 0, 256)
	var groups []string
	for i := range j.msgs {
		m := &j.msgs[i]
		prev := st.last[m.Subject]
		if _, known := st.last[m.Subject]; !known {
			r.subjects++
		}
		st.last[m.Subject] = m.Seq
		dest, ok := j.xf.RepublishTo(m.Subject)
		if !ok {
			continue
		}
		if jswire.ReservedDestination(dest) {
			r.m.dropped.WithLabelValues(reasonInvalidSubject).Inc()
			r.warn.Warn(r.cfg.Logger, r.cfg.Clock.Now(), "republish: suppressing republish with invalid subject",
				slog.String("stream", j.name), slog.String("subject", dest))
			continue
		}
		hdr = headers(hdr[:0], m, j.name, prev, j.xf.HeadersOnly())
		var data []byte
		if !j.xf.HeadersOnly() {
			data = m.Data
		}
		groups = r.cfg.Link.QueueGroups(dest, groups[:0])
		if r.cfg.Local != nil && !slices.Contains(groups, r.cfg.QueueGroup) {
			r.cfg.Local(dest, slices.Clone(hdr), data)
		}
		if err := r.cfg.Link.PublishQueues(dest, "", groups, hdr, data); err != nil {
			r.m.dropped.WithLabelValues(reasonLink).Inc()
			r.warn.Warn(r.cfg.Logger, r.cfg.Clock.Now(), "republish: the link did not take a message",
				slog.String("stream", j.name), slog.String("subject", dest), slog.String("err", err.Error()))
			continue
		}
		r.m.sent.Inc()
	}
	st.through = j.msgs[len(j.msgs)-1].Seq
	if r.subjects > SubjectsMax {
		r.subjects -= len(st.last)
		clear(st.last)
		st.through = 0
		r.m.forgotten.Inc()
	}
}

// lookup reads the last sequences of the subjects of j that st does not know, where the
// republish mapping takes them. When the read fails they go out as the first of their
// subjects (Nats-Last-Sequence 0), counted.
func (r *Republisher) lookup(ctx context.Context, j job, st *subjects, first uint64) {
	var missing []string
	seen := make(map[string]bool)
	for i := range j.msgs {
		subj := j.msgs[i].Subject
		if _, known := st.last[subj]; known || seen[subj] {
			continue
		}
		seen[subj] = true
		if _, ok := j.xf.RepublishTo(subj); ok {
			missing = append(missing, subj)
		}
	}
	if len(missing) == 0 {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	found, err := r.cfg.Store.LastSeqsBefore(lctx, j.id, missing, st.floor, first)
	if err != nil {
		r.m.lookups.WithLabelValues("error").Inc()
		r.warn.Warn(r.cfg.Logger, r.cfg.Clock.Now(), "republish: reading the last sequences of subjects failed",
			slog.String("stream", j.name), slog.String("err", err.Error()))
		return
	}
	r.m.lookups.WithLabelValues("ok").Inc()
	for _, subj := range missing {
		r.subjects++
		st.last[subj] = found[subj]
	}
}

// forget drops what st remembers of stream id.
func (r *Republisher) forget(id int64, st *subjects) {
	if st != nil {
		r.subjects -= len(st.last)
	}
	delete(r.streams, id)
}

// headers appends to dst m's header block with the fields nats-server adds, in its order
// and format.
func headers(dst []byte, m *pg.Message, stream string, last uint64, headersOnly bool) []byte {
	if len(m.Header) >= len("NATS/1.0\r\n\r\n") {
		dst = append(dst, m.Header[:len(m.Header)-2]...)
	} else {
		dst = append(dst, "NATS/1.0\r\n"...)
	}
	dst = appendField(dst, "Nats-Stream", stream)
	dst = appendField(dst, "Nats-Subject", m.Subject)
	dst = strconv.AppendUint(append(dst, "Nats-Sequence: "...), m.Seq, 10)
	dst = append(dst, "\r\n"...)
	dst = appendField(dst, "Nats-Time-Stamp", time.Unix(0, m.TS).UTC().Format(time.RFC3339Nano))
	dst = strconv.AppendUint(append(dst, "Nats-Last-Sequence: "...), last, 10)
	dst = append(dst, "\r\n"...)
	if headersOnly {
		dst = strconv.AppendInt(append(dst, "Nats-Msg-Size: "...), int64(len(m.Data)), 10)
		dst = append(dst, "\r\n"...)
	}
	return append(dst, "\r\n"...)
}

func appendField(dst []byte, name, value string) []byte {
	dst = append(dst, name...)
	dst = append(dst, ": "...)
	dst = append(dst, value...)
	return append(dst, "\r\n"...)
}
