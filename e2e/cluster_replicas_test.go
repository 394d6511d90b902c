package e2e

// Three replicas on one PostgreSQL as clients see them: each publish stored once, one answer
// to every API call, one consumer shared without overlap and taken over at once after a SIGKILL,
// and its live state reported through any replica.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestThreeReplicas runs three clustered replicas on one PostgreSQL: publishes through every
// replica are stored once each with dense sequences, every API call gets one answer, three
// clients of one durable pull consumer on different replicas share its messages without
// overlap, and after a SIGKILL of the replica serving it another delivers at once, not
// once a lease has run out (the time it takes is BenchmarkReplicas' business).
func TestThreeReplicas(t *testing.T) {
	t.Parallel()
	const stream = "TRIO"
	perReplica := 10_000
	if soak() {
		perReplica = 34_000
	}
	dsn := testDatabase(t)
	reps := startCluster(t, dsn, 3, "--lease", takeoverLease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// One answer per API call: the CLI fails on a second, contradicting one.
	out := reps[1].nats(t, "stream", "add", stream, "--subjects", "trio.>", "--defaults")
	if strings.Contains(out, "already in use") {
		t.Fatalf("nats stream add answered twice:\n%s", out)
	}
	jss := make([]jetstream.JetStream, len(reps))
	for i, r := range reps {
		_, jss[i] = r.connect(t)
		// Seen at once by every replica.
		if _, err := jss[i].Stream(ctx, stream); err != nil {
			t.Fatalf("stream info through replica %d: %v", i+1, err)
		}
	}
	// Each API request gets one answer, whichever replica the client is on.
	for i, r := range reps {
		nc, _ := r.connect(t)
		for _, subj := range []string{"$JS.API.INFO", "$JS.API.STREAM.INFO." + stream, "$JS.API.STREAM.NAMES"} {
			inbox := nats.NewInbox()
			sub, err := nc.SubscribeSync(inbox)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.PublishRequest(subj, inbox, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := sub.NextMsg(10 * time.Second); err != nil {
				t.Fatalf("%s through replica %d: %v", subj, i+1, err)
			}
			if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
				t.Fatalf("%s through replica %d answered twice: %s", subj, i+1, m.Data)
			}
			_ = sub.Unsubscribe()
		}
	}
	// Two overlapping streams are refused whichever replica is asked.
	if _, err := jss[2].CreateStream(ctx, jetstream.StreamConfig{Name: "OVER", Subjects: []string{"trio.a"}}); err == nil {
		t.Fatal("a stream overlapping TRIO was created")
	}

	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			publishAll(t, ctx, jss[i], fmt.Sprintf("trio.r%d", i+1), perReplica, func(k int) []byte { return []byte(strconv.Itoa(k)) })
		})
	}
	wg.Wait()
	total := uint64(3 * perReplica)
	for i := range reps {
		s, err := jss[i].Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if st := s.CachedInfo().State; st.Msgs != total || st.FirstSeq != 1 || st.LastSeq != total {
			t.Fatalf("through replica %d: %d messages, sequences %d..%d; want %d stored once, 1..%d",
				i+1, st.Msgs, st.FirstSeq, st.LastSeq, total, total)
		}
	}

	if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	pulled := newReceipts(len(reps))
	fetchCtx, stopFetch := context.WithCancel(ctx)
	var fetchers sync.WaitGroup
	fetchErrs := make(chan error, len(reps))
	for i := range reps {
		fetchers.Go(func() {
			cons, err := jss[i].Consumer(ctx, stream, "work")
			if err != nil {
				fetchErrs <- err
				return
			}
			for fetchCtx.Err() == nil {
				batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
				if err != nil {
					continue
				}
				for m := range batch.Messages() {
					md, err := m.Metadata()
					if err != nil {
						fetchErrs <- err
						return
					}
					pulled.note(i, md.Sequence.Stream, md.NumDelivered)
					_ = m.Ack()
				}
			}
		})
	}
	testwait.For(t, 3*time.Minute, func() error {
		select {
		case err := <-fetchErrs:
			t.Fatalf("fetch: %v", err)
		default:
		}
		if n := pulled.covered(); n < int(total) {
			return fmt.Errorf("%d of %d fetched", n, total)
		}
		return nil
	})
	stopFetch()
	fetchers.Wait()
	pulled.check(t, total, "pulled by the client on replica", fencedAny(t, reps))

	// A push consumer with a deliver group, its members on every replica.
	if _, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "pushwork",
		DeliverSubject: "deliver.trio", DeliverGroup: "grp", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	pushed := newReceipts(len(reps))
	for i, r := range reps {
		nc, _ := r.connect(t)
		if _, err := nc.QueueSubscribe("deliver.trio", "grp", func(m *nats.Msg) {
			md, err := m.Metadata()
			if err != nil {
				return
			}
			pushed.note(i, md.Sequence.Stream, md.NumDelivered)
			_ = m.Ack()
		}); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 3*time.Minute, func() error {
		if n := pushed.covered(); n < int(total) {
			return fmt.Errorf("%d of %d pushed", n, total)
		}
		return nil
	})
	spread := pushed.check(t, total, "pushed to the group member on replica", fencedAny(t, reps))
	t.Logf("push deliveries per group member: %v", spread)

	// Update and pause the pull consumer through each replica in turn: the one that serves
	// it decides and answers, and every replica's info then agrees.
	leaderOf := func(info *jetstream.ConsumerInfo) string {
		if info.Cluster == nil {
			return ""
		}
		return info.Cluster.Leader
	}
	for i := range reps {
		desc := fmt.Sprintf("updated through replica %d", i+1)
		upd, err := jss[i].UpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy, Description: desc})
		if err != nil {
			t.Fatalf("updating the consumer through replica %d: %v", i+1, err)
		}
		if got := upd.CachedInfo(); got.Config.Description != desc || leaderOf(got) == "" {
			t.Fatalf("update through replica %d answered description %q, leader %q", i+1, got.Config.Description, leaderOf(got))
		}
		until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		if p, err := jss[i].PauseConsumer(ctx, stream, "work", until); err != nil || !p.Paused || !p.PauseUntil.Equal(until) {
			t.Fatalf("pausing the consumer through replica %d: %+v %v", i+1, p, err)
		}
		leader := leaderOf(upd.CachedInfo())
		for j := range reps {
			c, err := jss[j].Consumer(ctx, stream, "work")
			if err != nil {
				t.Fatal(err)
			}
			got := c.CachedInfo()
			if got.Config.Description != desc || !got.Paused || got.Config.PauseUntil == nil || !got.Config.PauseUntil.Equal(until) || leaderOf(got) != leader {
				t.Fatalf("info through replica %d after changes through replica %d: description %q, paused %v until %v, leader %q; want %q, paused until %v, leader %q",
					j+1, i+1, got.Config.Description, got.Paused, got.Config.PauseUntil, leaderOf(got), desc, until, leader)
			}
		}
		if p, err := jss[(i+1)%len(reps)].ResumeConsumer(ctx, stream, "work"); err != nil || p.Paused {
			t.Fatalf("resuming the consumer through replica %d: %+v %v", (i+1)%len(reps)+1, p, err)
		}
	}
	for j := range reps {
		c, err := jss[j].Consumer(ctx, stream, "work")
		if err != nil {
			t.Fatal(err)
		}
		if c.CachedInfo().Paused {
			t.Fatalf("info through replica %d: still paused after the resume", j+1)
		}
	}

	// More consumers, so that the takeover below shows how the killed replica's spread.
	const spreadN = 11
	for k := range spreadN - 1 {
		if _, err := jss[k%len(reps)].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("spread%d", k), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	leaders := func(via int) (map[string]int, error) {
		out := make(map[string]int)
		st, err := jss[via].Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		l := st.ListConsumers(ctx)
		for info := range l.Info() {
			out[leaderOf(info)]++
		}
		return out, l.Err()
	}
	before, err := leaders(0)
	if err != nil {
		t.Fatal(err)
	}

	// SIGKILL the replica that serves the consumer; another serves it before a lease passes.
	info, err := jss[0].Consumer(ctx, stream, "work")
	if err != nil {
		t.Fatal(err)
	}
	cl := info.CachedInfo().Cluster
	serving := -1
	if cl != nil {
		_, _ = fmt.Sscanf(cl.Leader, "r%d", &serving)
		serving--
	}
	if serving < 0 || cl.Name != "jetgres" {
		t.Fatalf("consumer info's cluster block %+v names no replica of cluster jetgres", cl)
	}
	other := (serving + 1) % len(reps)
	if _, err := jss[other].Publish(ctx, "trio.after", []byte("x")); err != nil {
		t.Fatal(err)
	}
	cons, err := jss[other].Consumer(ctx, stream, "work")
	if err != nil {
		t.Fatal(err)
	}
	reps[serving].kill(t)
	killed := time.Now()
	var resumed time.Duration
	for resumed == 0 {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no delivery within 30 s of the SIGKILL")
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			continue
		}
		for m := range batch.Messages() {
			resumed = time.Since(killed)
			_ = m.Ack()
		}
	}
	t.Logf("FIGURES replicas=3 published=%d takeover_after_sigkill=%v", total, resumed.Round(time.Millisecond))
	if resumed >= takeoverLease {
		t.Errorf("delivery resumed %v after the SIGKILL, not before the lease of %v: the dead replica's consumer was not given up at once", resumed, takeoverLease)
	}

	// The killed replica's consumers spread over the two left: each takes no more than its
	// share while their leases run (one more when it looked twice before the other did), and
	// beyond that only what it took once free ones had waited a fencing deadline, as a
	// replica does when the other is slow to look (a loaded machine), and the replica the
	// fetches go through the consumer they ask for.
	dead := fmt.Sprintf("r%d", serving+1)
	var after map[string]int
	testwait.For(t, 30*time.Second, func() error {
		var err error
		if after, err = leaders(other); err != nil {
			return err
		}
		if after[dead] > 0 || after[""] > 0 {
			return fmt.Errorf("served by: %v", after)
		}
		return nil
	})
	t.Logf("consumers per replica before the SIGKILL of %s: %v; after: %v", dead, before, after)
	all := 0
	for _, n := range before {
		all += n
	}
	share := (all + 1) / 2
	for i, r := range reps {
		if i == serving {
			continue
		}
		name := fmt.Sprintf("r%d", i+1)
		m, err := r.metrics()
		if err != nil {
			t.Fatal(err)
		}
		overdue := int(m["jetgres_consumer_overdue_claims_total"])
		want := max(share+1, before[name]) + overdue
		if i == other {
			want++ // the fetches through it asked for the killed replica's consumer, which it then serves
		}
		if after[name] > want {
			t.Errorf("%s serves %d of %d consumers after the takeover (%d before, %d taken overdue), want at most %d", name, after[name], all, before[name], overdue, want)
		}
	}
}

// Consumer info through a replica that does not serve the consumer reports the serving
// replica's live state, what it delivered and what waits for an ack, not the ack floor
// PostgreSQL holds.
func TestConsumerInfoThroughAnyReplica(t *testing.T) {
	t.Parallel()
	const stream = "INFOS"
	reps := startCluster(t, testDatabase(t), 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	jss := make([]jetstream.JetStream, len(reps))
	for i, r := range reps {
		_, jss[i] = r.connect(t)
	}
	if _, err := jss[0].CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"infos.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := jss[i%len(reps)].Publish(ctx, "infos.a", nil); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := jss[0].CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "live", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// The queue group spread the publishes over the replicas at random: the one that serves
	// the consumer most often stored some of them, not the last.
	if n := cons.CachedInfo().NumPending; n != 10 {
		t.Fatalf("created with %d pending, want 10", n)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 4 {
		t.Fatalf("fetched %d messages, want 4", len(got))
	}
	// Acknowledging the second leaves the first, and so the ack floor, where they were.
	if err := got[1].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	// A replica reaches the serving one through the NATS cluster once the serving one's
	// forwarding subscription has reached it, which under a loaded machine can trail the
	// routes' forming: until then it answers from PostgreSQL, as it must when the serving
	// replica cannot be reached. Wait until each has answered with the live state once.
	for i := range reps {
		testwait.For(t, 30*time.Second, func() error {
			c, err := jss[i].Consumer(ctx, stream, "live")
			if err != nil {
				return err
			}
			if d := c.CachedInfo().Delivered; d.Stream != 4 {
				return fmt.Errorf("replica %d answers delivered %+v, not the serving replica's state yet", i+1, d)
			}
			return nil
		})
	}
	// From then on every replica answers with the serving one's state, every time: asked
	// several times, as the API queue group may pick another replica's member.
	var leader string
	for i := range reps {
		for range 5 {
			c, err := jss[i].Consumer(ctx, stream, "live")
			if err != nil {
				t.Fatalf("consumer info through replica %d: %v", i+1, err)
			}
			info := c.CachedInfo()
			if info.Cluster != nil && leader == "" {
				leader = info.Cluster.Leader
			}
			if info.Delivered.Stream != 4 || info.Delivered.Consumer != 4 || info.NumAckPending != 3 || info.NumPending != 6 ||
				info.AckFloor.Stream != 0 || info.Cluster == nil || info.Cluster.Leader != leader {
				t.Fatalf("info through replica %d: delivered %+v, ack floor %+v, %d ack pending, %d pending, cluster %+v; want delivered 4/4, floor 0/0, 3 ack pending, 6 pending, leader %q",
					i+1, info.Delivered, info.AckFloor, info.NumAckPending, info.NumPending, info.Cluster, leader)
			}
		}
	}
}
