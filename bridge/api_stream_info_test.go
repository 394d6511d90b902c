package bridge

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
