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
)

// BenchmarkCounterIncrements has 8 publishers, each on a connection of its own, increment
// one counter by one, b.N increments in all, against jetgres and a real JetStream (file
// storage) in the same run. sync waits for each PubAck before the next increment, as
// counters' Add does; async keeps up to 64 increments in flight per publisher. It reports
// increments per second, and fails unless the total is b.N. The floor rows publish plain
// messages to a plain stream on jetgres the same way: what the fast path, which takes
// no counter increment, does with the same publishers.
func BenchmarkCounterIncrements(b *testing.B) {
	const publishers = 8
	for _, mode := range []string{"sync", "async"} {
		for side, name := range []string{sideName[ours], sideName[theirs], "floor"} {
			b.Run(fmt.Sprintf("%s/%s", mode, name), func(b *testing.B) {
				var js jetstream.JetStream
				if side == theirs {
					js = startJetStream(b)
				} else {
					js = setup(b).js
				}
				ctx := context.Background()
				floor := side == 2
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
				errs := make(chan error, publishers)
				var wg sync.WaitGroup
				b.ResetTimer()
				for p, pjs := range pubs {
					n := b.N / publishers
					if p < b.N%publishers {
						n++
					}
					wg.Go(func() {
						if err := increment(ctx, pjs, mode == "async", !floor, n); err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
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
