package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/schedule"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testStream is a stream with schedules, as the scheduler sees one.
type testStream struct {
	id   int64
	name string
	cfg  server.StreamConfig
}

func (s *testStream) ID() int64                        { return s.id }
func (s *testStream) Name() string                     { return s.name }
func (s *testStream) ConfigView() *server.StreamConfig { return &s.cfg }

// testHost is the bridge's part for the scheduler, on a real database: its hooks run
// around each append of a produced message.
type testHost struct {
	db      *pg.DB
	mu      sync.Mutex
	streams []*testStream
	hold    func(ctx context.Context, id int64) (bool, error)
	release func(ctx context.Context, id int64) error
	before  func()
	after   func(o pg.Outcome)
	stored  atomic.Int64
}

func (h *testHost) Streams() []*testStream {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*testStream(nil), h.streams...)
}

func (h *testHost) setStreams(s ...*testStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.streams = s
}

func (h *testHost) Hold(ctx context.Context, id int64) (bool, error) {
	if h.hold == nil {
		return true, nil
	}
	return h.hold(ctx, id)
}

func (h *testHost) Release(ctx context.Context, id int64) error {
	if h.release == nil {
		return nil
	}
	return h.release(ctx, id)
}

func (h *testHost) Append(ctx context.Context, s *testStream, m pg.AppendMsg) (pg.Outcome, time.Duration, error) {
	if h.before != nil {
		h.before()
	}
	res, rtt, err := h.db.Append(ctx, []pg.AppendBatch{{StreamID: s.id, Msgs: []pg.AppendMsg{m}}}, time.Now().UnixNano())
	if err != nil {
		return pg.Outcome{}, rtt, err
	}
	o := res[0].Outcomes[0]
	if o.Err == nil {
		h.stored.Add(1)
	}
	if h.after != nil {
		h.after(o)
	}
	return o, rtt, nil
}

// newStream creates a stream with schedules, s.>.
func newStream(t *testing.T, db *pg.DB, name string) *testStream {
	t.Helper()
	row, err := db.CreateStream(t.Context(), name, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return &testStream{id: row.ID, name: name, cfg: server.StreamConfig{Name: name, Subjects: []string{"s.>"}, AllowMsgSchedules: true, AllowRollup: true}}
}

// publish stores a message as a client's publish is stored.
func publish(t *testing.T, db *pg.DB, s *testStream, subject string, data []byte, kv ...string) uint64 {
	t.Helper()
	m := pg.AppendMsg{Subject: subject, Data: data}
	if len(kv) > 0 {
		m.Header = jswire.AppendHeaders(nil, kv...)
	}
	res, _, err := db.Append(t.Context(), []pg.AppendBatch{{StreamID: s.id, Msgs: []pg.AppendMsg{m}}}, time.Now().UnixNano())
	if err != nil || res[0].Outcomes[0].Err != nil {
		t.Fatalf("publish on %s: %v %+v", subject, err, res)
	}
	return res[0].Outcomes[0].Seq
}

// oneShot stores a schedule on subject that fires once at at, to target.
func oneShot(t *testing.T, db *pg.DB, s *testStream, subject, target string, at time.Time, data []byte) uint64 {
	return publish(t, db, s, subject, data, server.JSSchedulePattern, "@at "+at.UTC().Format(time.RFC3339),
		server.JSScheduleTarget, target, server.JSMsgRollup, server.JSMsgRollupSubject)
}

// start runs a scheduler on store and host until the test ends.
func start(t *testing.T, store schedule.Store, host *testHost, clk *clocktest.Fake, lane *flow.Lane) *schedule.Scheduler[*testStream] {
	t.Helper()
	if lane == nil {
		lane = flow.NewFixed("append", 4)
	}
	sc, err := schedule.New(schedule.Config[*testStream]{Store: store, Host: host, Append: lane, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sc.Stop)
	return sc
}

// ticking waits for cond, moving the clock a scheduler period on before each look.
func ticking(t *testing.T, clk *clocktest.Fake, cond func() error) {
	t.Helper()
	testwait.For(t, 20*time.Second, func() error {
		clk.Advance(schedule.PeriodDefault)
		return cond()
	})
}

// count is how many live messages subject holds in s.
func count(t *testing.T, db *pg.DB, s *testStream, subject string) int {
	t.Helper()
	st, err := db.State(t.Context(), s.id)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _, err := db.ReadHeaders(t.Context(), pg.ReadParams{StreamID: s.id, From: 1, UpTo: st.LastSeq, MaxMsgs: int(st.LastSeq) + 1})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range msgs {
		if m.Subject == subject {
			n++
		}
	}
	return n
}

// Two replicas fire the same one-shot at once, as when one's session broke unknown to it
// while the other took the stream over: both read the schedule before either appends.
// One message is produced, and the moment an append returns, its schedule is gone: there
// is no step between the fire and the purge in which a crash leaves the schedule stored.
func TestOneShotFiresOnceAndPurgesInItsAppend(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	dbA, dbB := pgtest.OpenAt(t, url), pgtest.OpenAt(t, url)
	clk := clocktest.At(time.Now().Truncate(time.Second))
	s := newStream(t, dbA, "ONCE")
	oneShot(t, dbA, s, "s.sched", "s.out", clk.Now().Add(5*time.Second), []byte("payload"))

	// Each append waits, within a bound, for the other replica's to start: both fire
	// from what they read before either committed.
	var arrived atomic.Int32
	both := make(chan struct{})
	barrier := func() {
		if arrived.Add(1) == 2 {
			close(both)
		}
		select {
		case <-both:
		case <-time.After(5 * time.Second):
		}
	}
	var seam atomic.Int32
	checkSeam := func(db *pg.DB) func(pg.Outcome) {
		return func(o pg.Outcome) {
			if o.Err != nil {
				return
			}
			if _, err := db.LastBySubject(context.Background(), s.id, "s.sched"); !errors.Is(err, pg.ErrNotFound) {
				seam.Add(1)
			}
		}
	}
	hosts := []*testHost{{db: dbA, before: barrier, after: checkSeam(dbA)}, {db: dbB, before: barrier, after: checkSeam(dbB)}}
	for i, h := range hosts {
		h.setStreams(s)
		start(t, []*pg.DB{dbA, dbB}[i], h, clk, nil)
	}
	clk.Advance(5 * time.Second)
	ticking(t, clk, func() error {
		if n := arrived.Load(); n < 2 {
			return fmt.Errorf("%d replicas fired", n)
		}
		if count(t, dbA, s, "s.out") == 0 {
			return errors.New("nothing produced")
		}
		return nil
	})
	// A few more passes: a schedule left behind would fire again.
	for range 8 {
		clk.Advance(schedule.PeriodDefault)
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := hosts[0].stored.Load() + hosts[1].stored.Load(); n != 1 {
			return fmt.Errorf("%d produced messages stored", n)
		}
		return nil
	})
	if n := count(t, dbA, s, "s.out"); n != 1 {
		t.Fatalf("%d messages produced on s.out, want 1", n)
	}
	if n := count(t, dbA, s, "s.sched"); n != 0 {
		t.Fatalf("the one-shot schedule is still stored (%d)", n)
	}
	if n := seam.Load(); n != 0 {
		t.Fatalf("%d appends returned with the schedule still stored", n)
	}
}

// The replica that fires a one-shot dies the moment its transaction commits, before it
// hears the answer: the schedule is gone with the commit, and the replica that takes over
// fires nothing more.
func TestOneShotFiredByAReplicaThatDies(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	proxy := pgtest.NewProxy(t, url)
	viaProxy := pgtest.OpenAt(t, proxy.URL())
	clk := clocktest.At(time.Now().Truncate(time.Second))
	s := newStream(t, db, "DIES")
	oneShot(t, db, s, "s.sched", "s.out", clk.Now().Add(time.Second), []byte("once"))
	// The fire's commit is the pipeline that writes the schedule's tombstone.
	cut := proxy.Arm(pgtest.CutAnswer, func(sql string) bool { return strings.Contains(sql, "INSERT INTO jetgres.deleted") })
	dying := &testHost{db: viaProxy}
	dying.setStreams(s)
	sc := start(t, viaProxy, dying, clk, nil)
	ticking(t, clk, func() error {
		select {
		case <-cut:
			return nil
		default:
			return errors.New("the fire has not committed")
		}
	})
	sc.Stop()
	if out, sched := count(t, db, s, "s.out"), count(t, db, s, "s.sched"); out != 1 || sched != 0 {
		t.Fatalf("once the dying replica's fire committed: %d produced, %d schedules stored; want 1 and 0", out, sched)
	}

	var passes atomic.Int32
	next := &testHost{db: db, hold: func(context.Context, int64) (bool, error) { passes.Add(1); return true, nil }}
	next.setStreams(s)
	start(t, db, next, clk, nil)
	ticking(t, clk, func() error {
		if n := passes.Load(); n < 8 {
			return fmt.Errorf("%d passes of the replica that took over", n)
		}
		return nil
	})
	if n := next.stored.Load(); n != 0 {
		t.Fatalf("the replica that took over fired %d more", n)
	}
	if n := count(t, db, s, "s.out"); n != 1 {
		t.Fatalf("%d produced, want 1", n)
	}
}

// A scheduler that held the lock of a stream that is deleted gives it up, so that another
// session may take the key; the stream created again under its name is scheduled.
func TestDeletedStreamReleasesItsLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	own := func() *pg.Ownership {
		o, err := pgtest.OpenAt(t, url).OpenOwnership(ctx, nil, 10*time.Second, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(o.Close)
		return o
	}
	mine, other := own(), own()
	clk := clocktest.At(time.Now().Truncate(time.Second))
	var held sync.Map
	h := &testHost{db: db,
		hold: func(ctx context.Context, id int64) (bool, error) {
			ok, err := mine.HoldScheduler(ctx, id)
			if ok {
				held.Store(id, true)
			}
			return ok, err
		},
		release: mine.ReleaseScheduler,
	}
	old := newStream(t, db, "AGAIN")
	h.setStreams(old)
	start(t, db, h, clk, nil)
	ticking(t, clk, func() error {
		if _, ok := held.Load(old.id); !ok {
			return errors.New("the scheduler has not taken the stream's lock")
		}
		return nil
	})
	if ok, err := other.HoldScheduler(ctx, old.id); err != nil || ok {
		t.Fatalf("another session takes the lock the scheduler holds: %t %v", ok, err)
	}
	if err := db.DeleteStream(ctx, old.id); err != nil {
		t.Fatal(err)
	}
	h.setStreams()
	ticking(t, clk, func() error {
		ok, err := other.HoldScheduler(ctx, old.id)
		if err != nil || !ok {
			return fmt.Errorf("another session takes the deleted stream's lock: %t %v", ok, err)
		}
		return nil
	})

	again := newStream(t, db, "AGAIN")
	h.setStreams(again)
	oneShot(t, db, again, "s.sched", "s.out", clk.Now().Add(time.Second), []byte("again"))
	ticking(t, clk, func() error {
		if n := count(t, db, again, "s.out"); n != 1 {
			return fmt.Errorf("%d produced in the stream created again", n)
		}
		return nil
	})
}

// dataCounter is a Store that counts the bytes of message data its reads bring.
type dataCounter struct {
	*pg.DB
	data atomic.Int64
}

func (d *dataCounter) ReadHeaders(ctx context.Context, p pg.ReadParams) ([]pg.Message, uint64, error) {
	msgs, through, err := d.DB.ReadHeaders(ctx, p)
	for _, m := range msgs {
		d.data.Add(int64(len(m.Data)))
	}
	return msgs, through, err
}

func (d *dataCounter) GetMessage(ctx context.Context, streamID int64, seq uint64) (*pg.Message, error) {
	m, err := d.DB.GetMessage(ctx, streamID, seq)
	if m != nil {
		d.data.Add(int64(len(m.Data)))
	}
	return m, err
}

func (d *dataCounter) LastBySubject(ctx context.Context, streamID int64, filter string) (*pg.Message, error) {
	m, err := d.DB.LastBySubject(ctx, streamID, filter)
	if m != nil {
		d.data.Add(int64(len(m.Data)))
	}
	return m, err
}

// The scan reads no message's data: among 64 messages of 16 KiB, the scheduler reads the
// data of the schedule that fires, and that alone.
func TestScanReadsNoData(t *testing.T) {
	t.Parallel()
	db := pgtest.Open(t)
	clk := clocktest.At(time.Now().Truncate(time.Second))
	s := newStream(t, db, "DATA")
	big := []byte(strings.Repeat("x", 16<<10))
	for range 64 {
		publish(t, db, s, "s.plain", big)
	}
	payload := []byte("the schedule's payload")
	oneShot(t, db, s, "s.sched", "s.out", clk.Now().Add(time.Second), payload)
	store := &dataCounter{DB: db}
	h := &testHost{db: db}
	h.setStreams(s)
	start(t, store, h, clk, nil)
	ticking(t, clk, func() error {
		if count(t, db, s, "s.out") != 1 {
			return errors.New("nothing produced")
		}
		return nil
	})
	if got := store.data.Load(); got != int64(len(payload)) {
		t.Fatalf("the scheduler read %d bytes of message data, want %d (the fired schedule's)", got, len(payload))
	}
}

// A produced message's append takes a permit of the append lane: while the lane's one
// permit is held elsewhere, nothing fires; once it is given back, the schedule fires.
func TestProducedTakesAnAppendPermit(t *testing.T) {
	t.Parallel()
	db := pgtest.Open(t)
	clk := clocktest.At(time.Now().Truncate(time.Second))
	s := newStream(t, db, "PERMIT")
	oneShot(t, db, s, "s.sched", "s.out", clk.Now().Add(time.Second), nil)
	lane := flow.NewFixed("append", 1)
	p, ok := lane.TryAcquire()
	if !ok {
		t.Fatal("no permit free on a new lane")
	}
	var tried atomic.Bool
	h := &testHost{db: db, before: func() { tried.Store(true) }}
	h.setStreams(s)
	start(t, db, h, clk, lane)
	ticking(t, clk, func() error {
		if lane.Stats().Waiting == 0 {
			return errors.New("the scheduler does not wait for the lane")
		}
		return nil
	})
	if tried.Load() {
		t.Fatal("a produced message was appended without a permit of the append lane")
	}
	p.Abandon()
	ticking(t, clk, func() error {
		if count(t, db, s, "s.out") != 1 {
			return errors.New("nothing produced once the permit was free")
		}
		return nil
	})
}
