package bridge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkPublishManyStreams runs the overload sweep's load in process: closed-loop
// synchronous publishers (1 to 256) over 1, 16 or 256 streams, publisher i on the streams i,
// i+n, i+2n, … in turn, so that with many streams publishes to one stream never wait for each
// other and every wait is the push path's. Beside it, in the same run and at the same counts,
// two baselines: the naive bridge (responders on the same NATS server, JetStream off, that
// store each request with one autocommit INSERT before answering it: what anyone writes in an
// afternoon) and the naive INSERT (the same INSERT from the publishers themselves, no NATS). It
// reports where a publish's time went: the append lane's limit and its permit wait per publish,
// the streams per transaction and transactions per publish, a transaction's mean round trip and
// the statements prepared per publish, all of the cold run: jetgres runs twice, cold (a fresh
// jetgres and pool, as after a restart) and then warm. The test cluster runs with fsync off;
// point JETGRES_TEST_DATABASE_URL at a durable server to include the WAL flush, which is where
// this load spends its time.
func BenchmarkPublishManyStreams(b *testing.B) {
	for _, streams := range []int{256, 16, 1} {
		for _, n := range []int{1, 8, 32, 64, 256} {
			b.Run(fmt.Sprintf("streams=%d/publishers=%d", streams, n), func(b *testing.B) {
				var lane *flow.Lane
				tb := setup(b, setupOpts{config: func(c *Config) { lane = c.Append }})
				ctx := context.Background()
				for i := range streams {
					if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: fmt.Sprintf("M%d", i), Subjects: []string{fmt.Sprintf("m%d.>", i)}}); err != nil {
						b.Fatal(err)
					}
				}
				naive, err := pgtest.OpenNaive(ctx, tb.dbURL, int(pg.MaxConnsDefault))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(naive.Close)
				if err := naive.Reset(ctx); err != nil {
					b.Fatal(err)
				}
				nb, err := pgtest.ServeNaiveBridge(tb.nats.ClientURL(), naive, min(n, int(pg.MaxConnsDefault)))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(nb.Close)
				data := make([]byte, 128)
				run := func(op func(i, k int) error) (float64, []time.Duration) {
					return pgtest.ClosedLoopLatency(b, n, b.N, op)
				}
				publish := func(i, k int) error {
					_, err := tb.js.Publish(ctx, fmt.Sprintf("m%d.x", (i+n*k)%streams), data)
					return err
				}
				s0, h0, p0 := lane.Stats(), histograms(b, tb), tb.db.Stats().Prepares
				jg, jgTook := run(publish)
				s1, h1, p1 := lane.Stats(), histograms(b, tb), tb.db.Stats().Prepares
				warm, warmTook := run(publish)
				br, brTook := run(func(int, int) error { return pgtest.NaiveBridgePublish(ctx, tb.nc, "naive.x", data) })
				nv, _ := run(func(int, int) error { return naive.Insert(ctx, "m.x", data) })
				txs := h1["jetgres_fusion_commit_seconds"].count - h0["jetgres_fusion_commit_seconds"].count
				b.ReportMetric(jg, "publish/s")
				b.ReportMetric(warm, "warm/s")
				b.ReportMetric(br, "bridge/s")
				b.ReportMetric(nv, "naive/s")
				b.ReportMetric(jg/br, "x_bridge")
				b.ReportMetric(warm/br, "warm_x_bridge")
				b.ReportMetric(jg/nv, "x_naive")
				b.ReportMetric(warm/nv, "warm_x_naive")
				for _, l := range []struct {
					name string
					took []time.Duration
				}{{"", jgTook}, {"warm_", warmTook}, {"bridge_", brTook}} {
					b.ReportMetric(float64(pgtest.Percentile(l.took, 0.5).Microseconds())/1e3, l.name+"p50_ms")
					b.ReportMetric(float64(pgtest.Percentile(l.took, 0.99).Microseconds())/1e3, l.name+"p99_ms")
				}
				b.ReportMetric(float64(s1.Limit), "push_limit")
				b.ReportMetric(float64((s1.WaitTotal-s0.WaitTotal).Microseconds())/float64(b.N), "permit_wait_us/op")
				b.ReportMetric(txs/float64(b.N), "tx/op")
				b.ReportMetric(float64(p1-p0)/float64(b.N), "prepares/op")
				b.ReportMetric(h1.mean(h0, "jetgres_fusion_streams_per_transaction"), "streams/tx")
				b.ReportMetric(h1.mean(h0, "jetgres_fusion_commit_seconds")*1e3, "commit_ms")
			})
		}
	}
}

type histogram struct{ sum, count float64 }

type histogramSet map[string]histogram

// mean is the mean of the observations of histogram name made since before.
func (h histogramSet) mean(before histogramSet, name string) float64 {
	n := h[name].count - before[name].count
	if n == 0 {
		return 0
	}
	return (h[name].sum - before[name].sum) / n
}

// histograms reads the sums and counts of the bridge's histograms.
func histograms(t testing.TB, tb *testBundle) histogramSet {
	t.Helper()
	mfs, err := tb.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := histogramSet{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				out[mf.GetName()] = histogram{h.GetSampleSum(), float64(h.GetSampleCount())}
			}
		}
	}
	return out
}
