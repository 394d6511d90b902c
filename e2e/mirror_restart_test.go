package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// TestMirrorSurvivesPostgresRestart kills the private PostgreSQL under a jetgres whose
// mirror copies: once jetgres brought it back, the mirror copies again, from the last
// sequence it stored, and ends up with every message of its origin, none twice.
func TestMirrorSurvivesPostgresRestart(t *testing.T) {
	t.Parallel()
	j := startJetgres(t, options{})
	_, js := j.connect(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}}); err != nil {
		t.Fatal(err)
	}
	publishAll(t, ctx, js, "orders.a", 100, func(i int) []byte { return fmt.Appendf(nil, "before %d", i) })
	waitMirror := func(last uint64) {
		testwait.For(t, 90*time.Second, func() error {
			s, err := js.Stream(ctx, "M")
			if err != nil {
				return err
			}
			if st := s.CachedInfo().State; st.LastSeq != last || st.Msgs != last {
				return fmt.Errorf("mirror at %d with %d messages, want %d", st.LastSeq, st.Msgs, last)
			}
			return nil
		})
	}
	waitMirror(100)
	if err := syscall.Kill(postmasterPID(t, j.dataDir), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 60*time.Second, func() error {
		if err := privatePostgresRestarted(t, j); err != nil {
			return err
		}
		_, err := js.Publish(ctx, "orders.b", []byte("after 0"))
		return err
	})
	publishAll(t, ctx, js, "orders.b", 99, func(i int) []byte { return fmt.Appendf(nil, "after %d", i+1) })
	waitMirror(200)
	o, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := js.Stream(ctx, "M")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 200; seq++ {
		a, err := o.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("mirror seq %d: %v", seq, err)
		}
		if string(a.Data) != string(b.Data) || !a.Time.Equal(b.Time) {
			t.Fatalf("seq %d: origin %q %s, mirror %q %s", seq, a.Data, a.Time, b.Data, b.Time)
		}
	}
}
