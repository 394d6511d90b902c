package bridge

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jstwin"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// BenchmarkCounterIncrements has 8 publishers, each on a connection of its own, increment
// one counter by one, b.N increments in all, against jetgres and a real JetStream (file
// storage) in the same run, jetgres on a PostgreSQL of its own with fsync and
// synchronous_commit on, as applications run it. sync waits for each PubAck before the next increment, as
// counters' Add does; async keeps up to 64 increments in flight per publisher. It reports
// increments per second, and fails unless the total is b.N.
//
// Beside them, in the same run: JetStream with sync_always, whose PubAck promises what
// jetgres's does (the increment is on disk; by default JetStream syncs every two minutes);
// the floor, plain messages published to a plain jetgres stream the same way, what the fast
// path, which takes no increment, does with the same publishers; and, for sync, the naive
// INSERT: 8 sessions each storing one row per statement, committed on its own, on such a
// PostgreSQL, the rate of durable commits that 8 waiting writers get from it.
func BenchmarkCounterIncrements(b *testing.B) {
	const publishers = 8
	for _, mode := range []string{"sync", "async"} {
		for _, side := range []string{"jetgres", "jetstream", "jetstream_sync_always", "floor", "naive_insert"} {
			if side == "naive_insert" && mode == "async" {
				continue
			}
			b.Run(fmt.Sprintf("%s/%s", mode, side), func(b *testing.B) {
				var js jetstream.JetStream
				switch side {
				case "naive_insert":
					benchNaiveInserts(b, pgtest.Durable(b), publishers)
					return
				case "jetstream":
					js = startJetStream(b)
				case "jetstream_sync_always":
					js = startJetStreamWith(b, jstwin.Config{SyncAlways: true})
				default:
					js = setup(b, setupOpts{db: pgtest.OpenAt(b, pgtest.Durable(b))}).js
				}
				ctx := context.Background()
				floor := side == "floor"
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CTR", Subjects: []string{"ctr.>"}, AllowMsgCounter: !floor}); err != nil {
					b.Fatal(err)
				}
				pubs := make([]jetstream.JetStream, publishers)
				for i := range pubs {
					nc, err := nats.Connect(js.Conn().ConnectedUrl())
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(nc.Close)
					if pubs[i], err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(64)); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				inParallel(b, publishers, func(p, n int) error { return increment(ctx, pubs[p], mode == "async", !floor, n) })
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "incr/s")
				if floor {
					return
				}
				s, err := js.Stream(ctx, "CTR")
				if err != nil {
					b.Fatal(err)
				}
				last, err := s.GetLastMsgForSubject(ctx, "ctr.n")
				if err != nil {
					b.Fatal(err)
				}
				if want := fmt.Sprintf(`{"val":"%d"}`, b.N); string(last.Data) != want {
					b.Fatalf("total %s, want %s", last.Data, want)
				}
			})
		}
	}
}

// benchNaiveInserts has sessions store b.N rows in all, one autocommit INSERT each, on the
// database at url, and reports them as incr/s.
func benchNaiveInserts(b *testing.B, url string, sessions int) {
	ctx := context.Background()
	naive, err := pgtest.OpenNaive(ctx, url, sessions)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(naive.Close)
	if err := naive.Reset(ctx); err != nil {
		b.Fatal(err)
	}
	data := []byte(`{"val":"1"}`)
	b.ResetTimer()
	inParallel(b, sessions, func(_, n int) error {
		for range n {
			if err := naive.Insert(ctx, "ctr.n", data); err != nil {
				return err
			}
		}
		return nil
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "incr/s")
}

// inParallel runs do on workers goroutines, b.N operations in all split among them, and
// fails b with the first error.
func inParallel(b *testing.B, workers int, do func(worker, n int) error) {
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		n := b.N / workers
		if w < b.N%workers {
			n++
		}
		wg.Go(func() {
			if err := do(w, n); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// increment adds one to ctr.n n times through js, waiting for each PubAck, or with async
// as many at once as js lets be pending; without counter it publishes an empty message.
func increment(ctx context.Context, js jetstream.JetStream, async, counter bool, n int) error {
	msg := func() *nats.Msg {
		m := nats.NewMsg("ctr.n")
		if counter {
			m.Header.Set(server.JSMessageIncr, "1")
		}
		return m
	}
	if !async {
		for range n {
			if _, err := js.PublishMsg(ctx, msg()); err != nil {
				return err
			}
		}
		return nil
	}
	futures := make([]jetstream.PubAckFuture, 0, n)
	for range n {
		f, err := js.PublishMsgAsync(msg(), jetstream.WithStallWait(time.Minute))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-deadline.C:
			return fmt.Errorf("PubAcks still missing after a minute")
		}
	}
	return nil
}
