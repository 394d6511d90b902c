package sqlmove

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The settings the bridge gives its mover by default: the tick period
// (bridge.TickPeriodDefault), the idle back-off's bound (bridge.TickIdleMaxDefault) and a
// flush's messages (bridge.FlushMaxMsgsDefault).
const (
	testTick    = 50 * time.Millisecond
	testIdleMax = time.Second
	testMaxMsgs = 8192
)

// testStream is a stream as testHost serves it.
type testStream struct {
	id   int64
	name string
	cfg  *server.StreamConfig
}

func (s *testStream) ID() int64                        { return s.id }
func (s *testStream) Name() string                     { return s.name }
func (s *testStream) ConfigView() *server.StreamConfig { return s.cfg }

func (*testStream) StoredSubject(subject string) string { return subject }

// testHost plays the bridge over PostgreSQL alone: its streams are those stored, as of its
// last Sync; its header checks are the few of the publish path's that the tests use; no
// consumer wants anything; and it keeps the commits announced to it.
type testHost struct {
	db *pg.DB

	mu      sync.Mutex
	streams []*testStream
	syncs   int
	commits map[string][]pg.AppendResult // by stream name
	forgets map[string]int               // by stream name
}

func (h *testHost) Streams() []*testStream {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.streams)
}

func (h *testHost) Sync(ctx context.Context) error {
	stored, err := h.db.Streams(ctx)
	if err != nil {
		return err
	}
	var streams []*testStream
	for _, st := range stored {
		var cfg server.StreamConfig
		if err := json.Unmarshal(st.Config, &cfg); err != nil {
			return err
		}
		streams = append(streams, &testStream{id: st.ID, name: st.Name, cfg: &cfg})
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.streams = streams
	h.syncs++
	return nil
}

func (*testHost) Batch(s *testStream) pg.AppendBatch {
	return pg.AppendBatch{StreamID: s.id, DupWindow: s.cfg.Duplicates, Limits: pg.Limits{
		MaxMsgs: s.cfg.MaxMsgs, MaxBytes: s.cfg.MaxBytes, MaxMsgsPer: s.cfg.MaxMsgsPer,
		DiscardNew: s.cfg.Discard == server.DiscardNew}}
}

func (*testHost) Expectations(cfg *server.StreamConfig, hdr []byte, m *pg.AppendMsg) *server.ApiError {
	if jswire.HeaderValue(hdr, server.JSMessageTTL) != "" {
		return server.NewJSMessageTTLDisabledError()
	}
	m.MsgID = jswire.HeaderValue(hdr, server.JSMsgId)
	if v := jswire.HeaderValue(hdr, server.JSExpectedStream); v != "" && v != cfg.Name {
		return server.NewJSStreamNotMatchError()
	}
	if v := jswire.HeaderValue(hdr, server.JSExpectedLastSeq); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return server.NewJSStreamWrongLastSequenceConstantError()
		}
		m.ExpectLastSeq = &n
	}
	return nil
}

func (*testHost) NoInterest(_ *testStream, subjects []string) []bool {
	return make([]bool, len(subjects))
}

func (h *testHost) Commit(_ context.Context, s *testStream, r pg.AppendResult) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commits[s.name] = append(h.commits[s.name], r)
}

func (h *testHost) Forget(_ context.Context, s *testStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forgets[s.name]++
}

// announced is the sequences of the messages the commits announced to stream name stored,
// in the order announced.
func (h *testHost) announced(name string) []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var seqs []uint64
	for _, r := range h.commits[name] {
		for _, m := range r.Stored {
			seqs = append(seqs, m.Seq)
		}
	}
	return seqs
}

// sqlDB opens a fresh database with the streams of configs (their JSON configurations)
// created, and a raw connection to it for publishing and reading with SQL.
func sqlDB(t testing.TB, configs ...string) (*pg.DB, *rawsql.Pool) {
	t.Helper()
	url := pgtest.NewDB(t)
	db := pgtest.OpenAt(t, url)
	for _, c := range configs {
		createStream(t, db, c)
	}
	return db, rawsql.Open(t, url)
}

func createStream(t testing.TB, db *pg.DB, config string) pg.StreamRow {
	t.Helper()
	var cfg server.StreamConfig
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		t.Fatal(err)
	}
	st, err := db.CreateStream(t.Context(), cfg.Name, []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// newHost returns a host over db that has read the streams.
func newHost(t testing.TB, db *pg.DB) *testHost {
	t.Helper()
	h := &testHost{db: db, commits: map[string][]pg.AppendResult{}, forgets: map[string]int{}}
	if err := h.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	return h
}

// startMover starts a mover over db and h with the bridge's default settings, registering
// its metrics with reg unless it is nil. It stops when t ends.
func startMover(t testing.TB, db *pg.DB, h *testHost, reg prometheus.Registerer) *Mover[*testStream] {
	t.Helper()
	m, err := New(Config[*testStream]{Store: db, Append: flow.NewFixed("append", 4), Host: h, Registerer: reg,
		TickPeriod: testTick, IdleMax: testIdleMax, MaxMsgs: testMaxMsgs})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	return m
}

// streamHolds waits until stream name holds n messages, the last at sequence n.
func streamHolds(t testing.TB, ctx context.Context, raw *rawsql.Pool, name string, n int) {
	t.Helper()
	testwait.For(t, 30*time.Second, func() error {
		var msgs, last int64
		if err := raw.QueryRow(ctx, `SELECT messages, last_seq FROM jetgres.stream_list WHERE name = $1`, name).Scan(&msgs, &last); err != nil {
			return err
		}
		if msgs != int64(n) || last != int64(n) {
			return fmt.Errorf("stream %s holds %d messages up to %d, want %d", name, msgs, last, n)
		}
		return nil
	})
}

// 200 concurrent application transactions, each inserting a row and publishing one to three
// messages, committed or rolled back at random: exactly the committed messages are moved,
// each once, each transaction's in call order, and every one is announced to the stream.
func TestSQLPublishConcurrentTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, raw := sqlDB(t, `{"name":"ORDERS","subjects":["orders.>"]}`)
	h := newHost(t, db)
	startMover(t, db, h, nil)
	if err := raw.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	const txs = 200
	want := map[string]int{} // "tx.call" -> 1, for committed transactions
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range txs {
		commit := rand.IntN(2) == 0
		n := 1 + rand.IntN(3)
		wg.Go(func() {
			raw.AppTx(t, ctx, commit, func(q rawsql.Runner) error {
				if err := q.Exec(ctx, `INSERT INTO orders VALUES ($1)`, i); err != nil {
					return err
				}
				for c := range n {
					if err := rawsql.Publish(ctx, q, fmt.Sprintf("orders.%d", i%7), fmt.Sprintf("%d.%d", i, c), ""); err != nil {
						return err
					}
				}
				return nil
			})
			if commit {
				mu.Lock()
				for c := range n {
					want[fmt.Sprintf("%d.%d", i, c)] = 1
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	streamHolds(t, ctx, raw, "ORDERS", len(want))
	got := map[string]int{}
	lastCall := map[int]int{}
	for _, d := range raw.Strings(t, `SELECT convert_from(data, 'UTF8') FROM jetgres.messages('ORDERS')`) {
		got[d]++
		var tx, call int
		if _, err := fmt.Sscanf(d, "%d.%d", &tx, &call); err != nil {
			t.Fatal(err)
		}
		prev, ok := lastCall[tx]
		if !ok {
			prev = -1
		}
		if call != prev+1 {
			t.Errorf("transaction %d: call %d came after call %d (-1: none yet)", tx, call, prev)
		}
		lastCall[tx] = call
	}
	for k, n := range got {
		if want[k] != n {
			t.Errorf("message %s came %d times, want %d", k, n, want[k])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d distinct messages stored, want %d", len(got), len(want))
	}
	seqs := h.announced("ORDERS")
	if len(seqs) != len(want) || !slices.IsSorted(seqs) || seqs[0] != 1 || seqs[len(seqs)-1] != uint64(len(want)) {
		t.Fatalf("commits announced %d messages (first %v, last %v), want 1 to %d in order",
			len(seqs), seqs[:min(1, len(seqs))], seqs[max(len(seqs)-1, 0):], len(want))
	}
}

// What applications commit while no mover runs is moved, in call order, once one starts.
func TestSQLPublishWhileStopped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, raw := sqlDB(t, `{"name":"S","subjects":["s.>"]}`)
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		for i := range 3 {
			if err := rawsql.Publish(ctx, q, "s.x", strconv.Itoa(i), ""); err != nil {
				return err
			}
		}
		return nil
	})
	startMover(t, db, newHost(t, db), nil)
	streamHolds(t, ctx, raw, "S", 3)
	got := raw.Strings(t, `SELECT seq || ' ' || convert_from(data, 'UTF8') FROM jetgres.messages('S')`)
	if want := []string{"1 0", "2 1", "3 2"}; !slices.Equal(got, want) {
		t.Fatalf("stream holds %v, want %v", got, want)
	}
}

// A message its stream refuses at the move is not stored and is counted by reason, the
// same label values as the publish path's: the stream changed since the call (deleted
// before the mover read the streams or after, no longer taking the subject, a smaller
// max_msg_size, sealed), a header the publish path refuses, a duplicate, a limit, a failed
// expectation. The rest of the move is stored and announced.
func TestSQLPublishRefusedAtTheMove(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, raw := sqlDB(t,
		`{"name":"A","subjects":["a.>"]}`,
		`{"name":"B","subjects":["b.>"]}`,
		`{"name":"C","subjects":["c.>"],"duplicate_window":60000000000,"max_msgs":2,"discard":"new"}`)
	d := createStream(t, db, `{"name":"D","subjects":["d.>"]}`)
	e := createStream(t, db, `{"name":"E","subjects":["e.>"]}`)
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		for _, p := range []struct{ subject, data, headers string }{
			{"a.gone", "x", ""},
			{"a.kept", "far too large now", ""},
			{"b.1", "x", ""},
			{"c.1", "first", `{"Nats-Msg-Id": "x"}`},
			{"c.2", "again", `{"Nats-Msg-Id": "x"}`},
			{"c.3", "second", ""},
			{"c.4", "over the limit", ""},
			{"c.5", "x", `{"Nats-TTL": "1s"}`},
			{"c.6", "x", `{"Nats-Expected-Stream": "OTHER"}`},
			{"c.7", "x", `{"Nats-Expected-Last-Sequence": "99"}`},
			{"d.1", "x", ""},
			{"e.1", "x", ""},
		} {
			if err := rawsql.Publish(ctx, q, p.subject, p.data, p.headers); err != nil {
				return err
			}
		}
		return nil
	})
	for id, config := range map[int64]string{
		streamID(t, db, "A"): `{"name":"A","subjects":["a.kept"],"max_msg_size":8}`,
		streamID(t, db, "B"): `{"name":"B","subjects":["b.>"],"sealed":true}`,
	} {
		if err := db.UpdateStreamConfig(ctx, id, []byte(config)); err != nil {
			t.Fatal(err)
		}
	}
	// D is gone before the host reads the streams: the mover reads them again, and
	// refuses what still names none. E is gone after: its append finds no stream.
	if err := db.DeleteStream(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	h := newHost(t, db)
	if err := db.DeleteStream(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := startMover(t, db, h, reg)
	want := map[string]float64{reasonNotTaken: 1, stream.ReasonTooLarge: 1, stream.ReasonSealed: 1, stream.ReasonDuplicate: 1,
		stream.ReasonLimit: 1, reasonFeatureOff: 1, stream.ReasonExpected: 2, stream.ReasonNoStream: 2}
	testwait.For(t, 30*time.Second, func() error {
		for reason, n := range want {
			if got := testutil.ToFloat64(m.m.refused.WithLabelValues(reason)); got != n {
				return fmt.Errorf("refused %q: %v, want %v", reason, got, n)
			}
		}
		return nil
	})
	if got := testutil.ToFloat64(m.m.moved); got != 2 {
		t.Errorf("moved %v, want 2", got)
	}
	// Each refused message is kept, with its reason, but the duplicate: JetStream answers a
	// duplicate as stored.
	got := raw.Strings(t, `SELECT source || ' ' || coalesce(stream, '-') || ' ' || subject || ' ' || reason
		|| ' ' || (data = convert_to(CASE subject WHEN 'a.kept' THEN 'far too large now' WHEN 'c.4' THEN 'over the limit' ELSE 'x' END, 'UTF8'))
		FROM jetgres.outbox_rejected ORDER BY subject`)
	if want := []string{
		"publish A a.gone not_taken true", "publish A a.kept too_large true", "publish B b.1 sealed true",
		"publish C c.4 limit true", "publish C c.5 unsupported true", "publish C c.6 expected_header true",
		"publish C c.7 expected_header true", "publish - d.1 no_stream true", "publish - e.1 no_stream true",
	}; !slices.Equal(got, want) {
		t.Errorf("jetgres.outbox_rejected holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := raw.Strings(t, `SELECT seq || ' ' || subject FROM jetgres.messages('C')`); !slices.Equal(got, []string{"1 c.1", "2 c.3"}) {
		t.Errorf("C holds %v, want c.1 and c.3 at 1 and 2", got)
	}
	if got := h.announced("C"); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("commits announced %v to C, want 1 and 2", got)
	}
	h.mu.Lock()
	syncs, announcedE := h.syncs, len(h.commits["E"])
	h.mu.Unlock()
	if syncs < 2 {
		t.Errorf("the host read the streams %d times, want again once D's message came", syncs)
	}
	if announcedE != 0 {
		t.Errorf("%d commits announced to E, which was gone", announcedE)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	if want := []string{"jetgres_sql_publish_moved_total", "jetgres_sql_publish_moves_total",
		"jetgres_sql_publish_refused_total"}; !slices.Equal(names, want) {
		t.Errorf("registered %v, want %v", names, want)
	}
}

func streamID(t testing.TB, db *pg.DB, name string) int64 {
	t.Helper()
	stored, err := db.Streams(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stored {
		if st.Name == name {
			return st.ID
		}
	}
	t.Fatalf("no stream %s", name)
	return 0
}

// New names every missing or wrong setting.
func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	t.Parallel()
	_, err := New(Config[*testStream]{TickPeriod: -1})
	if err == nil {
		t.Fatal("New took an empty configuration")
	}
	for _, field := range []string{"Store", "Append", "Host", "TickPeriod", "IdleMax", "MaxMsgs"} {
		if !strings.Contains(err.Error(), "Config."+field) {
			t.Errorf("the error does not name Config.%s: %v", field, err)
		}
	}
}
