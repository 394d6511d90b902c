package bridge

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestRepublishWithReplicas runs two bridges on one database and one NATS server, which
// hands each publish to either: every message is republished once, by the replica that
// stored it, and its Nats-Last-Sequence names the previous message of its subject whichever
// replica stored that one; a stream under the destination stores each once.
func TestRepublishWithReplicas(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
	ctx := testContext(t)
	if _, err := a.js.CreateStream(ctx, jetstream.StreamConfig{Name: "RR", Subjects: []string{"rr.>"},
		RePublish: &jetstream.RePublish{Source: "rr.>", Destination: "rro.>"}}); err != nil {
		t.Fatal(err)
	}
	// The destination is a stream's too, which stores each message once, whichever replica
	// republished it.
	if _, err := a.js.CreateStream(ctx, jetstream.StreamConfig{Name: "RRO", Subjects: []string{"rro.>"}}); err != nil {
		t.Fatal(err)
	}
	b := setup(t, setupOpts{db: a.db, nats: a.nats, config: func(c *Config) { c.ReplicaName = "b" }})
	testwait.For(t, 5*time.Second, func() error {
		_, err := b.js.Stream(ctx, "RRO")
		return err
	})
	sub, err := a.nc.SubscribeSync("rro.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const n = 40
	subjects := []string{"rr.x", "rr.y", "rr.x.z"}
	want := make(map[uint64]string, n) // seq: subject and the previous seq of that subject
	last := map[string]uint64{}
	for i := range n {
		subj := subjects[i%len(subjects)]
		ack, err := a.js.Publish(ctx, subj, []byte(strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		want[ack.Sequence] = fmt.Sprintf("rro%s last=%d data=%d", subj[2:], last[subj], i)
		last[subj] = ack.Sequence
	}
	got := make(map[uint64]string, n)
	for range n {
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d republished: %v", len(got), err)
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if _, twice := got[seq]; twice {
			t.Fatalf("sequence %d republished twice", seq)
		}
		got[seq] = fmt.Sprintf("%s last=%s data=%s", m.Subject, m.Header.Get(jetstream.LastSequenceHeader), m.Data)
	}
	for seq, w := range want {
		if got[seq] != w {
			t.Errorf("sequence %d: republished %q, want %q", seq, got[seq], w)
		}
	}
	testwait.For(t, 10*time.Second, func() error {
		s, err := a.js.Stream(ctx, "RRO")
		if err != nil {
			return err
		}
		if got := s.CachedInfo().State.Msgs; got != n {
			return fmt.Errorf("the destination's stream holds %d messages, want %d", got, n)
		}
		return nil
	})
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("republished more than stored: %s %v", m.Subject, m.Header)
	}
	// Each replica republished what it stored, and needed PostgreSQL for what the other did.
	ra, rb := counterValue(t, a.reg, "jetgres_republished_total"), counterValue(t, b.reg, "jetgres_republished_total")
	if ra+rb != n || ra == 0 || rb == 0 {
		t.Fatalf("republished by a %v, by b %v; want %d between them, some by each", ra, rb, n)
	}
	lookups := func(reg *prometheus.Registry) float64 {
		m, _ := series(t, reg, "jetgres_republish_lookups_total", "result", "ok")
		return m.GetCounter().GetValue()
	}
	if lookups(a.reg)+lookups(b.reg) == 0 {
		t.Fatal("no replica read a subject's last sequence from PostgreSQL")
	}
}
