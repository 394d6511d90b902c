package bridge

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorResumesAfterRestart stops jetgres while a mirror copies, publishes to the
// origin meanwhile, and starts it again on the same database: the mirror goes on from the
// last sequence it stored, and ends up with every message of the origin under the origin's
// sequence and store time, none twice.
func TestMirrorResumesAfterRestart(t *testing.T) {
	ctx := testContext(t)
	tb := setup(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}}); err != nil {
		t.Fatal(err)
	}
	publish := func(tb *testBundle, from, to int) {
		for i := from; i < to; i++ {
			if _, err := tb.js.Publish(ctx, fmt.Sprintf("orders.%d", i%3), fmt.Appendf(nil, "order %d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitLast := func(tb *testBundle, last uint64) {
		testwait.For(t, 20*time.Second, func() error {
			s, err := tb.js.Stream(ctx, "M")
			if err != nil {
				return err
			}
			if st := s.CachedInfo().State; st.LastSeq != last || st.Msgs != last {
				return fmt.Errorf("mirror at last %d with %d messages, want %d", st.LastSeq, st.Msgs, last)
			}
			return nil
		})
	}
	publish(tb, 0, 50)
	waitLast(tb, 50)
	tb.stop(t)

	// The origin takes publishes while no mirror copies: through a bridge on the same
	// database whose engine cannot copy (it has no copy link).
	tb2 := setup(t, setupOpts{db: tb.db, config: func(c *Config) { c.CopyLink = nil }})
	publish(tb2, 50, 80)
	tb2.stop(t)

	tb3 := setup(t, setupOpts{db: tb.db})
	publish(tb3, 80, 100)
	waitLast(tb3, 100)
	o, err := tb3.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := tb3.js.Stream(ctx, "M")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 100; seq++ {
		om, err := o.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		mm, err := m.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("mirror seq %d: %v", seq, err)
		}
		if om.Subject != mm.Subject || string(om.Data) != string(mm.Data) || !om.Time.Equal(mm.Time) {
			t.Fatalf("seq %d: origin %s %q %s, mirror %s %q %s", seq, om.Subject, om.Data, om.Time, mm.Subject, mm.Data, mm.Time)
		}
	}
}

// TestSourcesResumeAfterRestart restarts jetgres while a stream sources two others: after
// the restart each source goes on after the last origin sequence the stream holds from it
// (read back from the Nats-Stream-Source headers), so that nothing is sourced twice.
func TestSourcesResumeAfterRestart(t *testing.T) {
	ctx := testContext(t)
	tb := setup(t)
	for _, name := range []string{"A", "B"} {
		if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Sources: []*jetstream.StreamSource{{Name: "A"}, {Name: "B", FilterSubject: "b.x"}}}); err != nil {
		t.Fatal(err)
	}
	publish := func(tb *testBundle, from, to int) {
		for i := from; i < to; i++ {
			for _, subj := range []string{"a.x", "b.x", "b.y"} {
				if _, err := tb.js.Publish(ctx, subj, fmt.Appendf(nil, "%s %d", subj, i)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	waitMsgs := func(tb *testBundle, msgs uint64) {
		testwait.For(t, 20*time.Second, func() error {
			s, err := tb.js.Stream(ctx, "S")
			if err != nil {
				return err
			}
			if st := s.CachedInfo().State; st.Msgs != msgs {
				return fmt.Errorf("%d messages sourced, want %d", st.Msgs, msgs)
			}
			return nil
		})
	}
	publish(tb, 0, 20)
	waitMsgs(tb, 40)
	tb.stop(t)
	tb2 := setup(t, setupOpts{db: tb.db, config: func(c *Config) { c.CopyLink = nil }})
	publish(tb2, 20, 30)
	tb2.stop(t)
	tb3 := setup(t, setupOpts{db: tb.db})
	publish(tb3, 30, 40)
	waitMsgs(tb3, 80)
	s, err := tb3.js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool)
	for seq := uint64(1); seq <= 80; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if seen[string(m.Data)] {
			t.Fatalf("%q sourced twice", m.Data)
		}
		seen[string(m.Data)] = true
	}
}
