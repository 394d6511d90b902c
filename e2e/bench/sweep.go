package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/pg/pgtest"
)

// The sweep's levels: streams × closed-loop synchronous publishers.
var (
	sweepStreamsFull     = []int{1, 16, 256}
	sweepPublishersFull  = []int{1, 8, 32, 64, 256}
	sweepStreamsQuick    = []int{16}
	sweepPublishersQuick = []int{8}
)

// SweepLevel is one level of the sweep: jetgres cold (a fresh node and pool, measured from
// its first publish) and warm (the same node right after), the naive bridge and the naive
// INSERT, each with the same publishers spread over the same number of streams (or subjects,
// for the baselines, which have no streams).
type SweepLevel struct {
	Streams    int        `json:"streams"`
	Publishers int        `json:"publishers"`
	Cold       SweepPoint `json:"cold"`
	Warm       SweepPoint `json:"warm"`
	Bridge     SweepPoint `json:"naive_bridge"`
	Insert     SweepPoint `json:"naive_insert"`
}

// SweepPoint is one side's throughput and latency at a level.
type SweepPoint struct {
	MsgsPerSec float64 `json:"msgs_per_sec"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	Errors     int     `json:"errors,omitempty"`
}

func sweepPoint(st OverloadStep) SweepPoint {
	return SweepPoint{MsgsPerSec: st.MsgsPerSec, P50us: st.Latency.P50us, P99us: st.Latency.P99us, Errors: st.Errors}
}

// naiveBridgeResponders is how many requests the naive bridge stores at once: one per
// publisher of the sweep's largest level, so that it never queues what jetgres would fuse.
const naiveBridgeResponders = 256

// runSweep measures how publishes fuse across streams: at each level a fresh jetgres node
// (cold, as after a restart) and then the same node warm, against the naive bridge and the
// naive INSERT on the same PostgreSQL.
func (r *runner) runSweep(ctx context.Context) {
	if r.cfg.URL != "" {
		r.rep.SweepSkipped = "it starts a fresh jetgres for every level, and --url names one already running"
		return
	}
	var naive *benchTarget
	for _, t := range r.targets {
		if t.naive != nil {
			naive = t
		}
	}
	if err := naive.naive.Reset(ctx); err != nil {
		r.fail(SectionSweep, naive, err)
		return
	}
	bridge, stop, err := r.startNaiveBridge(naive.naive)
	if err != nil {
		r.fail(SectionSweep, &benchTarget{name: TargetNaiveBridge}, err)
		return
	}
	defer stop()
	streams, publishers := sweepStreamsFull, sweepPublishersFull
	if r.cfg.Quick {
		streams, publishers = sweepStreamsQuick, sweepPublishersQuick
	}
	for _, s := range streams {
		for _, n := range publishers {
			lv, err := r.sweepLevel(ctx, s, n, naive, bridge)
			if err != nil {
				r.fail(SectionSweep, &benchTarget{name: fmt.Sprintf("%s (%d streams, %d publishers)", TargetJetgres, s, n)}, err)
				if ctx.Err() != nil {
					return
				}
				continue
			}
			r.rep.Sweep = append(r.rep.Sweep, lv)
		}
	}
}

// startNaiveBridge starts a plain NATS server, without JetStream, with the naive bridge's
// responders on it, and returns the publishers of overloadConns client connections.
func (r *runner) startNaiveBridge(q *pgtest.Naive) (pubs []publishFunc, stop func(), err error) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, nil, fmt.Errorf("naive bridge: nats server: %w", err)
	}
	go srv.Start()
	var conns []*nats.Conn
	var nb *pgtest.NaiveBridge
	stop = func() {
		for _, c := range conns {
			c.Close()
		}
		if nb != nil {
			nb.Close()
		}
		srv.Shutdown()
		srv.WaitForShutdown()
	}
	if !srv.ReadyForConnections(10 * time.Second) {
		stop()
		return nil, nil, errors.New("naive bridge: nats server did not start")
	}
	if nb, err = pgtest.ServeNaiveBridge(srv.ClientURL(), q, naiveBridgeResponders); err != nil {
		stop()
		return nil, nil, err
	}
	for range overloadConns {
		nc, err := nats.Connect(srv.ClientURL(), nats.Name("jetgres-bench-naive-bridge"))
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("naive bridge: connect: %w", err)
		}
		conns = append(conns, nc)
		pubs = append(pubs, func(ctx context.Context, subject string, data []byte) error {
			return pgtest.NaiveBridgePublish(ctx, nc, subject, data)
		})
	}
	return pubs, stop, nil
}

// sweepLevel runs one level: jetgres cold and warm on a node of its own, then the two
// baselines.
func (r *runner) sweepLevel(ctx context.Context, nstreams, n int, naive *benchTarget, bridge []publishFunc) (SweepLevel, error) {
	lv := SweepLevel{Streams: nstreams, Publishers: n}
	label := fmt.Sprintf("%d×%d", nstreams, n)
	cold, warm, err := r.sweepJetgres(ctx, nstreams, n, label)
	if err != nil {
		return lv, err
	}
	lv.Cold, lv.Warm = sweepPoint(cold), sweepPoint(warm)
	subjects := make([]string, nstreams)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("naive.%d", i)
	}
	st, err := r.step(ctx, &benchTarget{name: TargetNaiveBridge}, bridge, subjects, n, label)
	if err != nil {
		return lv, fmt.Errorf("naive bridge: %w", err)
	}
	lv.Bridge = sweepPoint(st)
	st, err = r.step(ctx, naive, []publishFunc{r.publisher(naive, nil)}, subjects, n, label)
	if err != nil {
		return lv, fmt.Errorf("naive INSERT: %w", err)
	}
	lv.Insert = sweepPoint(st)
	return lv, nil
}

// sweepJetgres starts a jetgres node with the default lanes, creates the level's streams,
// runs the level from the node's first publish (cold) and again after a warm-up (warm), and
// stops the node, its streams deleted.
func (r *runner) sweepJetgres(ctx context.Context, nstreams, n int, label string) (cold, warm OverloadStep, err error) {
	push, pop, ack, err := defaultLanes()
	if err != nil {
		return cold, warm, err
	}
	node, err := startJetgres(ctx, r.dsn, r.cfg.SynchronousCommit, push, pop, ack, r.log)
	if err != nil {
		return cold, warm, err
	}
	defer func() {
		if stopErr := node.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}()
	t := &benchTarget{name: TargetJetgres, url: node.url(), node: node}
	admin, err := dial(t.url, "jetgres-bench-sweep-admin")
	if err != nil {
		return cold, warm, err
	}
	defer admin.close()
	r.prog.phase(fmt.Sprintf("sweep %s: creating streams", label), int64(nstreams), 0)
	subjects := make([]string, nstreams)
	for i := range subjects {
		name := fmt.Sprintf("BENCH_SWEEP_%d", i)
		subjects[i] = fmt.Sprintf("sweep.%d", i)
		if _, err := admin.createStream(ctx, name, subjects[i]); err != nil {
			return cold, warm, err
		}
		defer r.cleanup(t, admin.deleteStream, name)
		r.prog.add(1)
	}
	pubs := make([]publishFunc, 0, overloadConns)
	for range overloadConns {
		c, err := dial(t.url, "jetgres-bench-sweep")
		if err != nil {
			return cold, warm, err
		}
		defer c.close()
		pubs = append(pubs, r.publisher(t, c))
	}
	if cold, err = r.stepAfter(ctx, t, pubs, subjects, n, label+" cold", 0); err != nil {
		return cold, warm, err
	}
	warm, err = r.step(ctx, t, pubs, subjects, n, label+" warm")
	return cold, warm, err
}

// rateRatio is a ÷ b, or 0 where b measured nothing.
func rateRatio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// sweepRows are the sweep's table rows.
func (rep *Report) sweepRows() [][]string {
	cell := func(p SweepPoint) string {
		return fmt.Sprintf("%s (%s / %s)", fmtRate(p.MsgsPerSec), fmtMs(p.P50us), fmtMs(p.P99us))
	}
	var rows [][]string
	for _, lv := range rep.Sweep {
		rows = append(rows, []string{fmt.Sprint(lv.Streams), fmt.Sprint(lv.Publishers),
			cell(lv.Cold), cell(lv.Warm), cell(lv.Bridge), cell(lv.Insert),
			fmtRatio(rateRatio(lv.Cold.MsgsPerSec, lv.Bridge.MsgsPerSec)), fmtRatio(rateRatio(lv.Warm.MsgsPerSec, lv.Bridge.MsgsPerSec)),
			fmtRatio(rateRatio(lv.Cold.MsgsPerSec, lv.Insert.MsgsPerSec)), fmtRatio(rateRatio(lv.Warm.MsgsPerSec, lv.Insert.MsgsPerSec))})
	}
	return rows
}

var sweepHeader = []string{"streams", "publishers", "jetgres cold, msg/s (p50 / p99)", "jetgres warm", "naive bridge", "naive INSERT",
	"cold ÷ bridge", "warm ÷ bridge", "cold ÷ INSERT", "warm ÷ INSERT"}

// sweepGoals checks the sweep against issue #25's goals, each at its worst level.
func sweepGoals(levels []SweepLevel) []Goal {
	if len(levels) == 0 {
		return nil
	}
	worst := func(from int, of func(SweepLevel) float64) (float64, string) {
		low, at := 0.0, ""
		for _, lv := range levels {
			if lv.Publishers < from {
				continue
			}
			if v := of(lv); at == "" || v < low {
				low, at = v, fmt.Sprintf("%d streams, %d publishers", lv.Streams, lv.Publishers)
			}
		}
		return low, at
	}
	var gs []Goal
	add := func(name string, from int, want float64, of func(SweepLevel) float64) {
		if got, at := worst(from, of); at != "" {
			gs = append(gs, atLeast(fmt.Sprintf("%s (lowest: %s)", name, at), got, want))
		}
	}
	add("sweep: jetgres cold vs naive bridge, from 8 publishers", 8, 1,
		func(lv SweepLevel) float64 { return rateRatio(lv.Cold.MsgsPerSec, lv.Bridge.MsgsPerSec) })
	add("sweep: jetgres warm vs naive bridge, from 8 publishers", 8, 1,
		func(lv SweepLevel) float64 { return rateRatio(lv.Warm.MsgsPerSec, lv.Bridge.MsgsPerSec) })
	add("sweep: jetgres warm vs naive INSERT, from 32 publishers", 32, 1,
		func(lv SweepLevel) float64 { return rateRatio(lv.Warm.MsgsPerSec, lv.Insert.MsgsPerSec) })
	one := make(map[int]SweepLevel)
	for _, lv := range levels {
		if lv.Streams == 1 {
			one[lv.Publishers] = lv
		}
	}
	low, at := 0.0, ""
	for _, lv := range levels {
		if o, ok := one[lv.Publishers]; ok && lv.Streams == 256 {
			if v := rateRatio(lv.Warm.MsgsPerSec, o.Warm.MsgsPerSec); at == "" || v < low {
				low, at = v, fmt.Sprintf("%d publishers", lv.Publishers)
			}
		}
	}
	if at != "" {
		gs = append(gs, atLeast(fmt.Sprintf("sweep: 256 streams vs 1 stream, warm, same publishers (lowest: %s)", at), low, 0.8))
	}
	for _, lv := range levels {
		if lv.Streams == 256 && lv.Publishers == 8 && lv.Bridge.P50us > 0 {
			gs = append(gs, atMost("sweep: p50 at 8 publishers over 256 streams, warm, vs the naive bridge's", lv.Warm.P50us/lv.Bridge.P50us, 1.2, "×"))
		}
	}
	return gs
}
