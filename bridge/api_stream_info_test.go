package bridge

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// Stream info's optional details, subject totals (with and without wildcards) and deleted
// sequences, as jetgres and JetStream report them after deletes and per-subject limits.
func TestStreamInfoDetailsMatchJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "SI", Subjects: []string{"si.>"}, MaxMsgsPerSubject: 3})
	for _, subj := range []string{"si.a", "si.b", "si.a", "si.c.x", "si.a", "si.a", "si.b", "si.c.y", "si.a"} {
		tw.pub(subj, []byte("x"))
	}
	tw.deleteMsg("SI", 7)
	tw.deleteMsg("SI", 4)
	for _, opts := range [][]jetstream.StreamInfoOpt{
		{jetstream.WithSubjectFilter(">")},
		{jetstream.WithSubjectFilter("si.*")},
		{jetstream.WithSubjectFilter("si.c.>")},
		{jetstream.WithSubjectFilter("si.a")},
		{jetstream.WithSubjectFilter("nope")},
		{jetstream.WithDeletedDetails(true)},
		{},
	} {
		var subjects [2]map[string]uint64
		var deleted [2][]uint64
		var numDeleted [2]int
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, "SI")
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(tw.ctx, opts...)
			if err != nil {
				t.Fatalf("%s: %v", sideName[side], err)
			}
			subjects[side], deleted[side], numDeleted[side] = info.State.Subjects, info.State.Deleted, info.State.NumDeleted
		}
		if !maps.Equal(subjects[ours], subjects[theirs]) || !slices.Equal(deleted[ours], deleted[theirs]) || numDeleted[ours] != numDeleted[theirs] {
			t.Errorf("stream info with %d options:\n jetgres   subjects %v deleted %v (%d)\n JetStream subjects %v deleted %v (%d)",
				len(opts), subjects[ours], deleted[ours], numDeleted[ours], subjects[theirs], deleted[theirs], numDeleted[theirs])
		}
	}
}

// A sealed stream takes nothing in and lets nothing out, with JetStream's errors: publishes,
// purges and deletes are refused, it cannot be unsealed, and no stream is created sealed.
func TestSealedStreamMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	cfg := jetstream.StreamConfig{Name: "SL", Subjects: []string{"sl.>"}, MaxAge: time.Hour}
	tw.createStream(cfg)
	tw.pubN("sl.a", 3, 8)
	sealed := cfg
	sealed.Sealed = true
	type limits struct {
		sealed, denyDelete, denyPurge, allowRollup bool
		maxAge                                     time.Duration
		discard                                    jetstream.DiscardPolicy
	}
	var got [2]limits
	for side, js := range tw.js {
		s, err := js.UpdateStream(tw.ctx, sealed)
		if err != nil {
			t.Fatalf("%s: seal: %v", sideName[side], err)
		}
		c := s.CachedInfo().Config
		got[side] = limits{c.Sealed, c.DenyDelete, c.DenyPurge, c.AllowRollup, c.MaxAge, c.Discard}
	}
	if got[ours] != got[theirs] {
		t.Errorf("sealed config: jetgres %+v, JetStream %+v", got[ours], got[theirs])
	}
	if _, code := tw.pub("sl.a", nil); code == 0 {
		t.Error("a sealed stream took a publish")
	}
	tw.purge("SL")
	if code := tw.deleteMsg("SL", 2); code == 0 {
		t.Error("a sealed stream let a message be deleted")
	}
	tw.want("SL", 3, 1, 3, 0)
	var codes [2][2]jetstream.ErrorCode
	for side, js := range tw.js {
		_, err := js.UpdateStream(tw.ctx, cfg)
		codes[0][side] = errCode(t, side, err)
		_, err = js.CreateStream(tw.ctx, jetstream.StreamConfig{Name: "SL2", Subjects: []string{"sl2.>"}, Sealed: true})
		codes[1][side] = errCode(t, side, err)
	}
	for i, what := range []string{"unseal", "create sealed"} {
		if codes[i][ours] != codes[i][theirs] || codes[i][ours] == 0 {
			t.Errorf("%s: jetgres err_code %d, JetStream %d", what, codes[i][ours], codes[i][theirs])
		}
	}
}

// Nats-Rollup, as KV purges use it ("sub") and as a whole-stream rollup ("all"), and its
// refusals, against JetStream: same sequences and error codes, same stream state after each.
func TestRollupMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "RU", Subjects: []string{"ru.>"}, AllowRollup: true})
	tw.createStream(jetstream.StreamConfig{Name: "NR", Subjects: []string{"nr.>"}})
	pub := func(subject, rollup string) {
		t.Helper()
		var seq [2]uint64
		var code [2]jetstream.ErrorCode
		for side, js := range tw.js {
			m := nats.NewMsg(subject)
			if rollup != "" {
				m.Header.Set("Nats-Rollup", rollup)
			}
			ack, err := js.PublishMsg(tw.ctx, m)
			if code[side] = errCode(t, side, err); code[side] == 0 {
				seq[side] = ack.Sequence
			}
		}
		if seq[ours] != seq[theirs] || code[ours] != code[theirs] {
			t.Fatalf("publish %s rollup %q: jetgres seq %d err_code %d, JetStream seq %d err_code %d",
				subject, rollup, seq[ours], code[ours], seq[theirs], code[theirs])
		}
	}
	same := func(step string) {
		t.Helper()
		st, err := tw.states("RU")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		t.Logf("%s: %s", step, brief(st[ours]))
	}
	for _, subj := range []string{"ru.a", "ru.b", "ru.a", "ru.c", "ru.a", "ru.b"} {
		pub(subj, "")
	}
	pub("ru.a", "sub")
	same("after a subject rollup")
	pub("ru.b", "")
	pub("ru.a", "sub")
	same("after another")
	pub("ru.c", "all")
	same("after a stream rollup")
	pub("ru.d", "")
	same("after a publish")
	pub("ru.a", "bogus")
	pub("nr.a", "sub")
	// A key-value purge is a subject rollup with a marker: the key reads as gone on both.
	for side, js := range tw.js {
		kv, err := js.CreateKeyValue(tw.ctx, jetstream.KeyValueConfig{Bucket: "B", History: 5})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"1", "2", "3"} {
			if _, err := kv.PutString(tw.ctx, "k", v); err != nil {
				t.Fatal(err)
			}
		}
		if err := kv.Purge(tw.ctx, "k"); err != nil {
			t.Fatalf("%s: purge: %v", sideName[side], err)
		}
		if _, err := kv.Get(tw.ctx, "k"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("%s: get after purge: %v", sideName[side], err)
		}
	}
	if st, err := tw.states("KV_B"); err != nil {
		t.Fatalf("bucket after purge: %v", err)
	} else {
		t.Logf("bucket after purge: %s", brief(st[ours]))
	}
}

// A stream list whose info reads fail answers the failure, as a 503 clients retry; it never
// lists the streams as missing, which would tell the client that they could not be found.
func TestStreamListAnswersADatabaseFailure(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	tb := setup(t, setupOpts{db: pgtest.OpenWith(t, pg.Config{URL: url, BackgroundTimeout: 500 * time.Millisecond})})
	ctx := testContext(t)
	newStream(t, ctx, tb, "S", "s.>")
	release := rawsql.Open(t, url).HoldRows(t, `LOCK TABLE jetgres.stream_state IN ACCESS EXCLUSIVE MODE`)
	defer release()
	lister := tb.js.ListStreams(ctx)
	var names []string
	for info := range lister.Info() {
		names = append(names, info.Config.Name)
	}
	var apiErr *jetstream.APIError
	if err := lister.Err(); !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.ErrorCode(server.ApiErrors[server.JSClusterNotAvailErr].ErrCode) {
		t.Fatalf("listing streams while their state cannot be read: %v (streams %v), want JetStream's 10008", err, names)
	}
}

// Outside cluster mode nats-server reports a cluster block in every stream info, with no
// cluster name and itself as the leader, and clients print it ("Cluster Information");
// jetgres names the replica that answers. A consumer's info has none outside cluster mode.
func TestClusterBlockMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "CB", Subjects: []string{"cb.>"}})
	tw.updateStream(jetstream.StreamConfig{Name: "CB", Subjects: []string{"cb.>"}, Description: "changed"})
	var blocks [2][2]*jetstream.ClusterInfo
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, "CB")
		if err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
		if _, err := s.CreateOrUpdateConsumer(tw.ctx, jetstream.ConsumerConfig{Durable: "D"}); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
		if _, err = s.CreateOrUpdateConsumer(tw.ctx, jetstream.ConsumerConfig{Durable: "D", Description: "changed"}); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
		c, err := s.Consumer(tw.ctx, "D")
		if err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
		blocks[side] = [2]*jetstream.ClusterInfo{s.CachedInfo().Cluster, c.CachedInfo().Cluster}
	}
	got, want := blocks[ours][0], blocks[theirs][0]
	if want == nil || want.Leader == "" {
		t.Fatalf("JetStream's stream info: cluster %+v, expected a block naming the leader", want)
	}
	if got == nil || got.Name != want.Name || got.Leader != tw.tb.bridge.cfg.ReplicaName || len(got.Replicas) != len(want.Replicas) {
		t.Fatalf("stream info's cluster block: jetgres %+v, JetStream %+v (leader %q here)", got, want, tw.tb.bridge.cfg.ReplicaName)
	}
	if got, want := blocks[ours][1], blocks[theirs][1]; (got == nil) != (want == nil) {
		t.Fatalf("consumer info's cluster block: jetgres %+v, JetStream %+v", got, want)
	}
}

// The metadata nats-server stamps into stream and consumer configs, as both report it after
// create, update and pause: the API level the asset needs (stored), the server's version and
// API level (in every response), and the user's own keys as the last request gave them. The
// one difference is the API level served: jetgres reports its own, as $JS.API.INFO does.
func TestMetadataMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	compare := func(what string, get func(js jetstream.JetStream) (map[string]string, error)) {
		t.Helper()
		var md [2]map[string]string
		for side, js := range tw.js {
			var err error
			if md[side], err = get(js); err != nil {
				t.Fatalf("%s: %s: %v", sideName[side], what, err)
			}
		}
		if got := md[ours][server.JSServerLevelMetadataKey]; got != strconv.Itoa(jswire.APILevel) {
			t.Fatalf("%s: jetgres reports API level %q, want %d", what, got, jswire.APILevel)
		}
		want := maps.Clone(md[theirs])
		if _, ok := want[server.JSServerLevelMetadataKey]; ok {
			want[server.JSServerLevelMetadataKey] = strconv.Itoa(jswire.APILevel)
		}
		if !maps.Equal(md[ours], want) {
			t.Fatalf("%s: metadata jetgres %v, JetStream %v", what, md[ours], md[theirs])
		}
	}
	streamMD := func(cfg jetstream.StreamConfig, update bool) func(js jetstream.JetStream) (map[string]string, error) {
		return func(js jetstream.JetStream) (map[string]string, error) {
			var s jetstream.Stream
			var err error
			if update {
				s, err = js.UpdateStream(tw.ctx, cfg)
			} else {
				s, err = js.CreateStream(tw.ctx, cfg)
			}
			if err != nil {
				return nil, err
			}
			return s.CachedInfo().Config.Metadata, nil
		}
	}
	cfg := jetstream.StreamConfig{Name: "MD", Subjects: []string{"md.>"}, Metadata: map[string]string{"owner": "team-a"}}
	compare("stream create", streamMD(cfg, false))
	compare("stream create again", streamMD(cfg, false))
	cfg.Metadata = map[string]string{"owner": "team-b", "tier": "gold"}
	compare("stream update", streamMD(cfg, true))
	cfg.Metadata = nil
	compare("stream update without metadata", streamMD(cfg, true))
	compare("stream info", func(js jetstream.JetStream) (map[string]string, error) {
		s, err := js.Stream(tw.ctx, "MD")
		if err != nil {
			return nil, err
		}
		return s.CachedInfo().Config.Metadata, nil
	})

	ccfg := jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, Metadata: map[string]string{"app": "x"}}
	consumerMD := func(cfg jetstream.ConsumerConfig) func(js jetstream.JetStream) (map[string]string, error) {
		return func(js jetstream.JetStream) (map[string]string, error) {
			c, err := js.CreateOrUpdateConsumer(tw.ctx, "MD", cfg)
			if err != nil {
				return nil, err
			}
			return c.CachedInfo().Config.Metadata, nil
		}
	}
	compare("consumer create", consumerMD(ccfg))
	ccfg.Metadata = map[string]string{"app": "y"}
	compare("consumer update", consumerMD(ccfg))
	compare("consumer pause", func(js jetstream.JetStream) (map[string]string, error) {
		if _, err := js.PauseConsumer(tw.ctx, "MD", "C", time.Now().Add(time.Hour)); err != nil {
			return nil, err
		}
		c, err := js.Consumer(tw.ctx, "MD", "C")
		if err != nil {
			return nil, err
		}
		return c.CachedInfo().Config.Metadata, nil
	})
	compare("consumer resume", func(js jetstream.JetStream) (map[string]string, error) {
		if _, err := js.ResumeConsumer(tw.ctx, "MD", "C"); err != nil {
			return nil, err
		}
		c, err := js.Consumer(tw.ctx, "MD", "C")
		if err != nil {
			return nil, err
		}
		return c.CachedInfo().Config.Metadata, nil
	})
}

// A stream info on an interest stream runs a retention pass only when one is due: acks seen
// since the last pass, or consumers that came, went or changed. On a quiet stream it reads
// no consumer; after an ack it shows the message gone, as JetStream does.
func TestStreamInfoRetainsOnlyWhenDue(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{})
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q", Subjects: []string{"q.>"}, Retention: jetstream.InterestPolicy})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "D", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := tb.js.Publish(ctx, "q.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	msgs := func() uint64 {
		t.Helper()
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	// What the consumer's creation made due is settled by the first info, or the maintainer.
	if n := msgs(); n != 3 {
		t.Fatalf("the stream holds %d messages, want 3", n)
	}
	passes := counterValue(t, tb.reg, "jetgres_retention_passes_total")
	for range 5 {
		if n := msgs(); n != 3 {
			t.Fatalf("the stream holds %d messages, want 3", n)
		}
	}
	if n := counterValue(t, tb.reg, "jetgres_retention_passes_total"); n != passes {
		t.Fatalf("five stream infos of a quiet stream ran %v retention passes, want none", n-passes)
	}
	batch, err := c.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := msgs(); n != 2 {
		t.Fatalf("after an ack the stream holds %d messages, want 2", n)
	}
	if n := counterValue(t, tb.reg, "jetgres_retention_passes_total"); n == passes {
		t.Fatal("an ack was applied without a retention pass")
	}
}
