package retention

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var _ Store = (*pg.DB)(nil)

// fakeStream is a stream whose configuration is set before the engine sees it.
type fakeStream struct {
	id    int64
	name  string
	cfg   server.StreamConfig
	flush atomic.Int64
	// closeRows is what ChunkCloseRows reports.
	closeRows int64
}

func (s *fakeStream) ID() int64                        { return s.id }
func (s *fakeStream) Name() string                     { return s.name }
func (s *fakeStream) ConfigView() *server.StreamConfig { return &s.cfg }
func (s *fakeStream) FlushSince() int64                { return s.flush.Load() }
func (s *fakeStream) ChunkCloseRows() int64            { return s.closeRows }

func newStream(id int64, retention server.RetentionPolicy) *fakeStream {
	name := fmt.Sprintf("S%d", id)
	return &fakeStream{id: id, name: name, cfg: server.StreamConfig{Name: name, Retention: retention}}
}

// fakeStore answers from what the test set and records what it was asked to change.
type fakeStore struct {
	mu sync.Mutex
	// consumers are the stored consumers, by stream id.
	consumers map[int64][]pg.Consumer
	// retained is what the next Retain reports; expired and enforced what the next
	// ExpireOlder and EnforceLimits report; candidates what ChunkDropCandidates reports.
	retained   pg.RetainResult
	expired    uint64
	enforced   uint64
	candidates []int64
	// err fails every call.
	err error

	listed       int
	retains      []pg.RetainParams
	interestGone []int64
	expiries     []cutoff
	limits       []pg.Limits
	prunes       []cutoff
	dropped      []int64
	closes       []pg.ChunkClose
	reaps        int
}

// cutoff is one call by stream id and a time in Unix nanoseconds.
type cutoff struct {
	id int64
	at int64
}

func newStore() *fakeStore { return &fakeStore{consumers: make(map[int64][]pg.Consumer)} }

func (f *fakeStore) Consumers(_ context.Context, streamID int64) ([]pg.Consumer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listed++
	return slices.Clone(f.consumers[streamID]), f.err
}

func (f *fakeStore) Retain(_ context.Context, p pg.RetainParams) (pg.RetainResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retains = append(f.retains, p)
	return f.retained, f.err
}

func (f *fakeStore) InterestGone(_ context.Context, id int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.interestGone = append(f.interestGone, id)
	return f.err
}

func (f *fakeStore) ExpireOlder(_ context.Context, id int64, at int64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expiries = append(f.expiries, cutoff{id, at})
	return f.expired, f.err
}

func (f *fakeStore) Expire(_ context.Context, p pg.ExpireParams) (pg.ExpireResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expiries = append(f.expiries, cutoff{p.StreamID, p.Now})
	return pg.ExpireResult{Removed: f.expired}, f.err
}

func (f *fakeStore) EnforceLimits(_ context.Context, _ int64, lim pg.Limits) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.limits = append(f.limits, lim)
	return f.enforced, f.err
}

func (f *fakeStore) PruneMsgIDs(_ context.Context, id int64, at int64) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prunes = append(f.prunes, cutoff{id, at})
	return 0, f.err
}

func (f *fakeStore) ChunkDropCandidates(context.Context, time.Duration) ([]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.candidates), f.err
}

func (f *fakeStore) DropChunks(_ context.Context, id int64, _ time.Duration) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropped = append(f.dropped, id)
	return 1, f.err
}

func (f *fakeStore) CloseChunks(_ context.Context, closes []pg.ChunkClose) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes = append(f.closes, closes...)
	return 0, f.err
}

func (f *fakeStore) ReapChunks(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reaps++
	return 0, f.err
}

// read runs fn on the store's records under its lock.
func (f *fakeStore) read(fn func(f *fakeStore)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// fakeHost serves the consumers the test names and records the events it is told of.
type fakeHost struct {
	mu      sync.Mutex
	streams []*fakeStream
	// served is the progress of the consumers this process serves, by name.
	served map[string]ConsumerProgress
	local  [][]string

	events    []string
	refreshes int
}

var _ Host[*fakeStream] = (*fakeHost)(nil)

func newHost(streams ...*fakeStream) *fakeHost {
	return &fakeHost{streams: streams, served: make(map[string]ConsumerProgress)}
}

func (h *fakeHost) Streams() []*fakeStream {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.streams)
}

func (h *fakeHost) Served(_ *fakeStream, row pg.Consumer) (ConsumerProgress, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.served[row.Name]
	return p, ok
}

func (h *fakeHost) LocalFilters(*fakeStream) [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.local)
}

func (h *fakeHost) Purged(_ context.Context, s *fakeStream, first uint64, consumed bool) {
	h.note(fmt.Sprintf("purged %s first=%d consumed=%v", s.Name(), first, consumed))
}

func (h *fakeHost) Removed(s *fakeStream, first uint64) {
	h.note(fmt.Sprintf("removed %s first=%d", s.Name(), first))
}

func (h *fakeHost) Mark(_ context.Context, s *fakeStream, last []pg.Message, ttl time.Duration) (int, error) {
	h.note(fmt.Sprintf("marked %s %d ttl=%s", s.Name(), len(last), ttl))
	return len(last), nil
}

func (h *fakeHost) RefreshUsage(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refreshes++
	return nil
}

func (h *fakeHost) note(ev string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
}

// take returns the events told since the last take.
func (h *fakeHost) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	evs := h.events
	h.events = nil
	return evs
}

func (h *fakeHost) serve(name string, p ConsumerProgress) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.served[name] = p
}

// setStreams replaces the streams the host serves.
func (h *fakeHost) setStreams(streams ...*fakeStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.streams = streams
}

// bundle is an engine on fakes and a fake clock.
type bundle struct {
	e     *Enforcer[*fakeStream]
	store *fakeStore
	host  *fakeHost
	clock *clocktest.Fake
}

// setup builds an engine over the given streams, not started.
func setup(t *testing.T, streams ...*fakeStream) *bundle {
	t.Helper()
	b := &bundle{store: newStore(), host: newHost(streams...), clock: clocktest.New()}
	e, err := New(Config[*fakeStream]{Store: b.store, Host: b.host, Clock: b.clock})
	if err != nil {
		t.Fatal(err)
	}
	b.e = e
	return b
}

// noteAcks makes e note acks and settle as a started engine does, without its maintainer:
// the test alone runs passes.
func noteAcks[S StreamView](e *Enforcer[S]) { e.running.Store(true) }

// consumer is a stored consumer row with the given filters, made at a fixed time.
func consumer(t *testing.T, streamID int64, name string, floor uint64, filters ...string) pg.Consumer {
	t.Helper()
	cfg, err := json.Marshal(server.ConsumerConfig{Durable: name, FilterSubjects: filters})
	if err != nil {
		t.Fatal(err)
	}
	return pg.Consumer{StreamID: streamID, Name: name, Config: cfg, AckStreamSeq: floor,
		Created: time.Unix(1_700_000_000, 0)}
}
