package bridge

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest"
)

// A stream info counts subjects from a count kept with the state it was made at, extended
// by the subjects of appends since. compareAll, which every twin step calls, reads
// num_subjects from both sides after each step; each step below changes the stream in one
// way a kept count could survive wrongly.

func TestNumSubjectsAfterEachChangeMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "NC", Subjects: []string{"nc.>"}})
	for i := range 12 {
		tw.pub(fmt.Sprintf("nc.%d", i%5), []byte("x"))
	}
	tw.pub("nc.new", []byte("x"))
	tw.pub("nc.0", []byte("x"))
	tw.deleteMsg("NC", 13)                             // the only nc.new
	tw.deleteMsg("NC", 1)                              // an nc.0 among others, and the first
	tw.purge("NC", jetstream.WithPurgeSubject("nc.1")) // every nc.1
	tw.purge("NC", jetstream.WithPurgeSubject("nc.2"), jetstream.WithPurgeKeep(1))
	tw.purge("NC", jetstream.WithPurgeSequence(5)) // nc.4 at 5 goes, the one at 10 stays
	tw.purge("NC", jetstream.WithPurgeKeep(3))
	tw.pub("nc.3", []byte("x"))
	tw.pub("nc.9", []byte("x"))
	tw.purge("NC")
	tw.pub("nc.a", []byte("x"))
	tw.pub("nc.b", []byte("x"))
}

// Every put into a bucket-like stream replaces the subject's last message: the counts come
// from the subject index of the publish path while it matches.
func TestNumSubjectsPerSubjectLimitMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "KV", Subjects: []string{"kv.>"}, MaxMsgsPerSubject: 1})
	for _, subj := range []string{"kv.a", "kv.b", "kv.a", "kv.c", "kv.a", "kv.b"} {
		tw.pub(subj, []byte("v"))
	}
	tw.deleteMsg("KV", 4) // kv.c
	tw.pub("kv.d", []byte("v"))
	tw.updateStream(jetstream.StreamConfig{Name: "KV", Subjects: []string{"kv.>"}, MaxMsgsPerSubject: 1, MaxMsgs: 2})
	tw.pub("kv.e", []byte("v"))
}

func TestNumSubjectsAfterExpiryMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "EXP", Subjects: []string{"exp.>"}, MaxAge: time.Second})
	tw.pub("exp.a", []byte("x"))
	tw.pub("exp.b", []byte("x"))
	tw.settle("EXP", func(st jetstream.StreamState) bool { return st.Msgs == 0 })
	tw.compareAll("expiry")
	tw.pub("exp.c", []byte("x"))
}

// A second replica's publishes reach the database but not this process's memory: the count
// this one kept must not survive them.
func TestNumSubjectsAfterAnotherReplicaPublishesMatchesJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "RP", Subjects: []string{"rp.>"}})
	tw.createStream(jetstream.StreamConfig{Name: "RK", Subjects: []string{"rk.>"}, MaxMsgsPerSubject: 1})
	tw.pub("rp.a", []byte("x"))
	tw.pub("rk.a", []byte("x"))
	other := setup(t, setupOpts{db: pgtest.OpenAt(t, tw.tb.dbURL), config: func(c *Config) { c.ReplicaName = "other" }})
	for _, subj := range []string{"rp.b", "rp.a", "rk.b", "rk.a", "rp.c"} {
		for side, js := range [2]jetstream.JetStream{other.js, tw.js[theirs]} {
			if _, err := js.Publish(tw.ctx, subj, []byte("x")); err != nil {
				t.Fatalf("%s: publish %s: %v", sideName[side], subj, err)
			}
		}
		tw.compareAll("another replica's publish to " + subj)
	}
	tw.pub("rp.d", []byte("x"))
	tw.pub("rk.c", []byte("x"))
}
