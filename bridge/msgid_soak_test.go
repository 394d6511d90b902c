package bridge

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// BenchmarkMsgIDStorage publishes messages that all carry a Nats-Msg-Id (one in a hundred
// repeats an id sent just before, as a retrying client would) through the bridge to a
// stream with a short duplicate window, on a freshly created database. It watches the
// de-duplication id buckets in pg_stat_user_tables (size and dead tuples) while publishing
// and after the window has passed, and times, from beside the bridge, the same id lookup
// the append runs, from the first publish on, before anything was analyzed.
//
//	go test -bench MsgIDStorage -run xxx -benchtime 1x ./bridge/
//
// JETGRES_IDSOAK_MSGS sets the publish count (default 2,000,000).
func BenchmarkMsgIDStorage(b *testing.B) {
	n := envCount(b, "JETGRES_IDSOAK_MSGS", 2_000_000)
	for b.Loop() {
		idSoak(b, n)
	}
}

const (
	idSoakWindow  = 2 * time.Second
	idSoakRepeat  = 100 // every this many publishes repeats the id of the one idSoakRepeat/2 before
	idSoakLookups = 256 // ids per timed lookup, half of them stored
	idSoakProbe   = 50 * time.Millisecond
)

func idSoak(b *testing.B, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	url := pgtest.NewDB(b)
	raw := rawsql.Open(b, url)
	// The lookups the appends make are timed too, as functions, by the server.
	if err := raw.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database()); END $$`); err != nil {
		b.Fatal(err)
	}
	tb := setup(b, setupOpts{db: pgtest.OpenAt(b, url)})
	probe, err := pgtest.OpenProbe(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(probe.Close)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDS", Subjects: []string{"ids.>"},
		Duplicates: idSoakWindow, MaxMsgs: 200_000}); err != nil {
		b.Fatal(err)
	}
	s := tb.bridge.streams.Lookup("IDS")
	like := fmt.Sprintf(`ids\_%d\_%%`, s.ID())

	var sent atomic.Int64
	var pubErrs atomic.Int64
	js, err := jetstream.New(tb.nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { pubErrs.Add(1) }),
		jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}

	// Timed lookups, as the append makes them, on their own connection.
	var lookups []time.Duration
	var lookupErr error
	pctx, stopProbe := context.WithCancel(ctx)
	var probing sync.WaitGroup
	probing.Go(func() {
		t := time.NewTicker(idSoakProbe)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			top := int(sent.Load())
			ids := make([]string, 0, idSoakLookups)
			for i := range idSoakLookups / 2 {
				ids = append(ids, idSoakID(max(top-1-i, 0)), fmt.Sprintf("absent-%d-%d", top, i))
			}
			start := time.Now()
			err := raw.Exec(pctx, `SELECT count(*) FROM jetgres.msg_ids_seen($1, $2, $3)`, s.ID(), ids, time.Now().Add(-idSoakWindow).UnixNano())
			switch {
			case err == nil:
				lookups = append(lookups, time.Since(start))
			case strings.Contains(err.Error(), "42P01"):
				// Unlike an append, this lookup does not lock the stream's row first, so a
				// prune may drop a bucket it listed.
			case pctx.Err() == nil:
				lookupErr = err
				return
			default:
				return
			}
		}
	})

	// Bucket statistics once a second.
	type sample struct {
		when  time.Duration
		sent  int64
		st    pgtest.TableStats
		calls int64   // of msg_ids_seen by the appends, so far
		ms    float64 // their total time
	}
	var samples []sample
	var sampling sync.WaitGroup
	start := time.Now()
	sampling.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			st, err := probe.TableStats(pctx, "jetgres", like)
			if err != nil {
				continue
			}
			sm := sample{when: time.Since(start), sent: sent.Load(), st: st}
			if err := raw.QueryRow(pctx, `SELECT coalesce(sum(calls), 0), coalesce(sum(total_time), 0) FROM pg_stat_user_functions
				WHERE schemaname = 'jetgres' AND funcname = 'msg_ids_seen'`).Scan(&sm.calls, &sm.ms); err == nil {
				samples = append(samples, sm)
			}
		}
	})

	// Each repeat is checked as soon as it is answered, while both messages are still
	// stored: a repeat is a duplicate when its flush started within the window of its
	// original's. One that waited behind a commit slower than the window is stored anew,
	// rightly, and is counted apart; one stored anew inside the window is a wrong answer.
	type pair struct {
		i          int
		orig, rept jetstream.PubAckFuture
	}
	pairs := make(chan pair, n/idSoakRepeat+1)
	var dups, late int
	var wrong []string
	stream, err := js.Stream(ctx, "IDS")
	if err != nil {
		b.Fatal(err)
	}
	var checking sync.WaitGroup
	checking.Go(func() {
		for p := range pairs {
			o, r := <-p.orig.Ok(), <-p.rept.Ok()
			switch {
			case o == nil || r == nil:
				wrong = append(wrong, fmt.Sprintf("publish %d or its repeat: no PubAck", p.i))
			case r.Duplicate && r.Sequence == o.Sequence:
				dups++
			case r.Duplicate:
				wrong = append(wrong, fmt.Sprintf("repeat of publish %d answered with seq %d, the original has %d", p.i, r.Sequence, o.Sequence))
			default:
				om, err1 := stream.GetMsg(ctx, o.Sequence)
				rm, err2 := stream.GetMsg(ctx, r.Sequence)
				switch {
				case err1 != nil || err2 != nil:
					wrong = append(wrong, fmt.Sprintf("repeat of publish %d stored anew at seq %d; reading both: %v, %v", p.i, r.Sequence, err1, err2))
				case rm.Time.Sub(om.Time) >= idSoakWindow:
					late++
				default:
					wrong = append(wrong, fmt.Sprintf("repeat of publish %d stored anew at seq %d, %v after the original", p.i, r.Sequence, rm.Time.Sub(om.Time)))
				}
			}
		}
	})
	pending := make(map[int]jetstream.PubAckFuture)
	payload := make([]byte, 16)
	for i := range n {
		id := idSoakID(i)
		if i%idSoakRepeat == idSoakRepeat-1 {
			id = idSoakID(i - idSoakRepeat/2)
		}
		f, err := js.PublishAsync("ids.x", payload, jetstream.WithMsgID(id), jetstream.WithStallWait(time.Minute))
		if err != nil {
			b.Fatalf("publish %d: %v", i, err)
		}
		switch i % idSoakRepeat {
		case idSoakRepeat - 1 - idSoakRepeat/2:
			pending[i] = f
		case idSoakRepeat - 1:
			pairs <- pair{i - idSoakRepeat/2, pending[i-idSoakRepeat/2], f}
			delete(pending, i-idSoakRepeat/2)
		}
		sent.Store(int64(i + 1))
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	pubTime := time.Since(start)
	stopProbe()
	probing.Wait()
	sampling.Wait()
	if lookupErr != nil {
		b.Fatal(lookupErr)
	}
	if e := pubErrs.Load(); e > 0 {
		b.Fatalf("%d publishes failed", e)
	}
	close(pairs)
	checking.Wait()

	// Idle: once the window has passed, the prune drops every bucket.
	var after pgtest.TableStats
	testwait.For(b, time.Minute, func() error {
		st, err := probe.TableStats(ctx, "jetgres", like)
		if err != nil {
			return err
		}
		after = st
		if st.Tables > 0 {
			return fmt.Errorf("%d id buckets still there, %d bytes", st.Tables, st.Bytes)
		}
		return nil
	})
	// Statistics of the buckets that remained until the end are flushed within seconds of
	// the sessions going idle; the counters of a dropped bucket go with it, so the peak
	// while publishing is what tells.
	time.Sleep(statsSettle)
	var peak pgtest.TableStats
	for _, sm := range samples {
		peak.Tables = max(peak.Tables, sm.st.Tables)
		peak.Bytes = max(peak.Bytes, sm.st.Bytes)
		peak.Live = max(peak.Live, sm.st.Live)
		peak.Dead = max(peak.Dead, sm.st.Dead)
	}
	var catalogDead int64
	if err := raw.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'jetgres' AND relname = 'id_buckets'`).Scan(&catalogDead); err != nil {
		b.Fatal(err)
	}

	// The appends' lookups: their mean time in each second that had some.
	var perSecond []float64
	for i := 1; i < len(samples); i++ {
		if c := samples[i].calls - samples[i-1].calls; c > 0 {
			perSecond = append(perSecond, (samples[i].ms-samples[i-1].ms)/float64(c))
		}
	}
	slices.Sort(perSecond)
	slices.Sort(lookups)
	if len(lookups) == 0 {
		b.Fatal("no lookup was timed")
	}
	median, p99, slowest := lookups[len(lookups)/2], lookups[len(lookups)*99/100], lookups[len(lookups)-1]
	b.Logf("%d publishes with ids in %v: %.0f msg/s; duplicate window %v; repeats: %d answered duplicate, %d stored a window or more after the original, %d wrong",
		n, pubTime.Round(time.Millisecond), float64(n)/pubTime.Seconds(), idSoakWindow, dups, late, len(wrong))
	step := max(len(samples)/5, 1)
	for i := 0; i < len(samples); i += step {
		sm := samples[i]
		b.Logf("  %6.1fs %8d sent: %2d buckets, live %7d, dead %d, %6.2f MiB", sm.when.Seconds(), sm.sent, sm.st.Tables, sm.st.Live, sm.st.Dead, float64(sm.st.Bytes)/(1<<20))
	}
	b.Logf("peak while publishing: %d buckets, live %d, dead %d, %.2f MiB; after the window: %d buckets, %d bytes; catalog dead tuples %d",
		peak.Tables, peak.Live, peak.Dead, float64(peak.Bytes)/(1<<20), after.Tables, after.Bytes, catalogDead)
	b.Logf("lookups of %d ids (%d timed, from the first publish on a fresh database): median %v, p99 %v, slowest %v (%.1fx the median)",
		idSoakLookups, len(lookups), median, p99, slowest, float64(slowest)/float64(median))
	if len(perSecond) > 0 {
		b.Logf("appends' lookups: %d calls; mean per second: median %.3f ms, slowest second %.3f ms (%.1fx the median)",
			samples[len(samples)-1].calls, perSecond[len(perSecond)/2], perSecond[len(perSecond)-1], perSecond[len(perSecond)-1]/perSecond[len(perSecond)/2])
	}
	b.ReportMetric(float64(peak.Bytes)/(1<<20), "peak-MiB")
	b.ReportMetric(float64(peak.Dead), "dead-tuples")
	b.ReportMetric(float64(slowest)/float64(median), "slowest/median")
	for _, w := range wrong[:min(len(wrong), 10)] {
		b.Error(w)
	}
	if peak.Dead != 0 {
		b.Errorf("%d dead tuples in the id buckets, want 0", peak.Dead)
	}
}

func idSoakID(i int) string { return "id-" + strconv.Itoa(i) }
