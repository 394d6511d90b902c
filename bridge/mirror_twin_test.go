package bridge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// pubHeaders publishes n messages with headers to subject on both sides.
func (tw *twin) pubHeaders(subject string, n int) {
	tw.t.Helper()
	for i := range n {
		for side, js := range tw.js {
			m := nats.NewMsg(subject)
			// Every third one has only the header a copy drops.
			if i%3 != 2 {
				m.Header.Set("K", fmt.Sprint(i))
			}
			m.Header.Set("Nats-Expected-Stream", "ORDERS")
			m.Data = fmt.Appendf(nil, "order %d", i)
			if _, err := js.PublishMsg(tw.ctx, m); err != nil {
				tw.t.Fatalf("%s: publish: %v", sideName[side], err)
			}
		}
	}
}

// sameCopy checks that stream copy holds, on each side, the messages of origin under the
// same sequences, subjects, data and store times (the Nats-Expected-* headers gone), and
// that both sides hold the same.
func (tw *twin) sameCopy(origin, copy string, last uint64) {
	tw.t.Helper()
	var seen [2][]string
	for side, js := range tw.js {
		o, err := js.Stream(tw.ctx, origin)
		if err != nil {
			tw.t.Fatal(err)
		}
		c, err := js.Stream(tw.ctx, copy)
		if err != nil {
			tw.t.Fatal(err)
		}
		for seq := uint64(1); seq <= last; seq++ {
			om, oerr := o.GetMsg(tw.ctx, seq)
			cm, cerr := c.GetMsg(tw.ctx, seq)
			// A message deleted from the origin after it was copied stays in the copy.
			if cerr != nil {
				if oerr == nil {
					tw.t.Fatalf("%s: seq %d: origin has it, copy %v", sideName[side], seq, cerr)
				}
				seen[side] = append(seen[side], fmt.Sprintf("%d deleted", seq))
				continue
			}
			if oerr != nil {
				om = cm
			}
			if om.Subject != cm.Subject || !bytes.Equal(om.Data, cm.Data) || !om.Time.Equal(cm.Time) {
				tw.t.Fatalf("%s: seq %d: origin %s %q %s, copy %s %q %s", sideName[side], seq, om.Subject, om.Data, om.Time, cm.Subject, cm.Data, cm.Time)
			}
			if cm.Header.Get("Nats-Expected-Stream") != "" || cm.Header.Get("K") != om.Header.Get("K") {
				tw.t.Fatalf("%s: seq %d: copy headers %v, origin %v", sideName[side], seq, cm.Header, om.Header)
			}
			seen[side] = append(seen[side], fmt.Sprintf("%d %s %q %v", seq, cm.Subject, cm.Data, cm.Header))
		}
	}
	if fmt.Sprint(seen[ours]) != fmt.Sprint(seen[theirs]) {
		tw.t.Fatalf("copies differ:\njetgres   %v\njetstream %v", seen[ours], seen[theirs])
	}
}

// copyInfo compares the mirror and sources blocks of both sides' stream info once both
// have heard from their origins.
func (tw *twin) copyInfo(name string) {
	tw.t.Helper()
	norm := func(si *jetstream.StreamSourceInfo) string {
		if si == nil {
			return "none"
		}
		c := *si
		if c.Active < 0 || c.Active > 10*time.Second {
			return fmt.Sprintf("not active: %v", c.Active)
		}
		c.Active = 0
		b, _ := json.Marshal(c)
		return string(b)
	}
	testwait.For(tw.t, 10*time.Second, func() error {
		var got [2]string
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, name)
			if err != nil {
				return err
			}
			info := s.CachedInfo()
			got[side] = norm(info.Mirror)
			for _, si := range info.Sources {
				got[side] += " " + norm(si)
			}
		}
		if got[ours] != got[theirs] {
			return fmt.Errorf("stream %s copy info:\njetgres   %s\njetstream %s", name, got[ours], got[theirs])
		}
		return nil
	})
}

// configJSON is a stream's configuration as a client reads it, without the metadata that
// names server versions.
func (tw *twin) configJSON(side int, name string) string {
	tw.t.Helper()
	s, err := tw.js[side].Stream(tw.ctx, name)
	if err != nil {
		tw.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Metadata = nil
	b, _ := json.Marshal(cfg)
	return string(b)
}

func TestMirrorTwin(t *testing.T) {
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, AllowDirect: true})
	tw.pubHeaders("orders.new", 10)
	tw.deleteMsg("ORDERS", 4)

	for _, bad := range []jetstream.StreamConfig{
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "ORDERS"}, Subjects: []string{"bad"}},
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "ORDERS"}, FirstSeq: 5},
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "ORDERS"}, Sources: []*jetstream.StreamSource{{Name: "X"}}},
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "ORDERS", FilterSubject: "orders.a",
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "orders.b", Destination: "b"}}}},
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "ORDERS", External: &jetstream.ExternalStream{APIPrefix: "$JS.API"}}},
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "OR.DERS"}},
		{Name: "BAD", Mirror: &jetstream.StreamSource{Name: "ORDERS", SubjectTransforms: []jetstream.SubjectTransformConfig{
			{Source: "orders.*", Destination: "a"}, {Source: "orders.a", Destination: "b"}}}},
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "ORDERS"}, {Name: "ORDERS"}}},
	} {
		var code [2]jetstream.ErrorCode
		for side, js := range tw.js {
			_, err := js.CreateStream(tw.ctx, bad)
			code[side] = errCode(t, side, err)
		}
		if code[ours] != code[theirs] || code[ours] == 0 {
			t.Errorf("create %+v: jetgres err_code %d, jetstream %d", bad.Mirror, code[ours], code[theirs])
		}
	}

	tw.createStream(jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	tw.createStream(jetstream.StreamConfig{Name: "M5", MaxMsgs: 5, MaxMsgsPerSubject: 3, Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	// A transform on a mirror of a stream without direct gets: a mirror of one with them
	// answers the origin's direct gets too, transformed, in JetStream.
	tw.createStream(jetstream.StreamConfig{Name: "SHIP", Subjects: []string{"ship.>"}})
	for i := range 6 {
		tw.pub(fmt.Sprintf("ship.%d", i%2), fmt.Appendf(nil, "ship %d", i))
	}
	tw.createStream(jetstream.StreamConfig{Name: "MF", Mirror: &jetstream.StreamSource{Name: "SHIP",
		SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "ship.1", Destination: "one"}}}})
	if a, b := tw.configJSON(ours, "M"), tw.configJSON(theirs, "M"); a != b {
		t.Errorf("mirror config:\njetgres   %s\njetstream %s", a, b)
	}
	tw.settle("M", func(st jetstream.StreamState) bool { return st.LastSeq == 10 })
	tw.sameCopy("ORDERS", "M", 10)
	tw.copyInfo("M")

	// A mirror takes no publishes: it has no subjects, and its mirror can not change.
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		_, err := js.UpdateStream(tw.ctx, jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS", FilterSubject: "orders.a"}})
		code[side] = errCode(t, side, err)
	}
	if code[ours] != code[theirs] || code[ours] == 0 {
		t.Errorf("mirror update: jetgres err_code %d, jetstream %d", code[ours], code[theirs])
	}

	tw.pubHeaders("orders.paid", 5)
	for _, m := range []string{"M", "M5"} {
		tw.settle(m, func(st jetstream.StreamState) bool { return st.LastSeq == 15 })
	}
	tw.deleteMsg("ORDERS", 13)
	tw.pubHeaders("orders.shipped", 2)
	tw.settle("M", func(st jetstream.StreamState) bool { return st.LastSeq == 17 })
	tw.sameCopy("ORDERS", "M", 17)
	tw.copyInfo("M")
	tw.settle("M5", func(st jetstream.StreamState) bool { return st.LastSeq == 17 })
	tw.settle("MF", func(st jetstream.StreamState) bool { return st.Msgs == 3 })
	tw.copyInfo("MF")
	if a, b := tw.sourced(ours, "MF"), tw.sourced(theirs, "MF"); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("filtered mirror:\njetgres   %v\njetstream %v", a, b)
	}

	// A purged origin: the mirror keeps what it copied and goes on with what comes next.
	tw.purge("ORDERS")
	tw.pubHeaders("orders.returned", 3)
	tw.settle("M", func(st jetstream.StreamState) bool { return st.LastSeq == 20 })
	tw.sameCopy("ORDERS", "M", 20)
	tw.copyInfo("M")
	// A mirror made after the purge starts where the origin's messages start.
	tw.createStream(jetstream.StreamConfig{Name: "MP", Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	tw.settle("MP", func(st jetstream.StreamState) bool { return st.LastSeq == 20 && st.Msgs == 3 })

	// Promoted, the mirror is an ordinary stream: it keeps what it copied and takes
	// publishes under its own name.
	tw.updateStream(jetstream.StreamConfig{Name: "M"})
	tw.pub("M", []byte("after promotion"))
	tw.copyInfo("M")
}

// TestMirrorOriginDeletedTwin deletes a mirror's origin: once the mirror notices (its
// consumer went with the origin, so its heartbeats stop) its stream info reports why it
// cannot copy, as JetStream's does; and once the origin is created again and passes the
// mirror's last sequence, the mirror copies again from there.
func TestMirrorOriginDeletedTwin(t *testing.T) {
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	tw.pubHeaders("orders.new", 3)
	tw.createStream(jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	tw.settle("M", func(st jetstream.StreamState) bool { return st.LastSeq == 3 })
	for side, js := range tw.js {
		if err := js.DeleteStream(tw.ctx, "ORDERS"); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	tw.streams = slices.DeleteFunc(tw.streams, func(s string) bool { return s == "ORDERS" })
	// A health interval, the retry threshold and a back-off, on both sides.
	testwait.For(t, 90*time.Second, func() error {
		var got [2]string
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, "M")
			if err != nil {
				return err
			}
			if mi := s.CachedInfo().Mirror; mi == nil || mi.Error == nil {
				return fmt.Errorf("%s: mirror info %+v", sideName[side], mi)
			} else {
				got[side] = fmt.Sprint(mi.Error.ErrorCode)
			}
		}
		if got[ours] != got[theirs] {
			return fmt.Errorf("mirror error: jetgres %s, jetstream %s", got[ours], got[theirs])
		}
		return nil
	})
	tw.createStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	tw.pubHeaders("orders.again", 5)
	testwait.For(t, 2*time.Minute, func() error {
		st, err := tw.states("M")
		if err != nil {
			return err
		}
		if st[ours].LastSeq != 5 {
			return fmt.Errorf("mirror at %d", st[ours].LastSeq)
		}
		return nil
	})
	tw.copyInfo("M")
}

// TestMirrorDirectTwin: a mirror of a stream with direct gets inherits mirror_direct and
// answers the origin's direct gets, which shows once the origin is gone.
func TestMirrorDirectTwin(t *testing.T) {
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, AllowDirect: true})
	tw.pubHeaders("orders.new", 4)
	tw.createStream(jetstream.StreamConfig{Name: "M", Mirror: &jetstream.StreamSource{Name: "ORDERS"}})
	tw.settle("M", func(st jetstream.StreamState) bool { return st.LastSeq == 4 })
	for side, js := range tw.js {
		if err := js.DeleteStream(tw.ctx, "ORDERS"); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	tw.streams = slices.DeleteFunc(tw.streams, func(s string) bool { return s == "ORDERS" })
	for _, req := range []string{`{"seq":2}`, `{"last_by_subj":"orders.new"}`, `{"seq":9}`} {
		var got [2]string
		for side, js := range tw.js {
			m, err := js.Conn().Request("$JS.API.DIRECT.GET.ORDERS", []byte(req), 5*time.Second)
			if err != nil {
				t.Fatalf("%s: direct get %s: %v", sideName[side], req, err)
			}
			got[side] = fmt.Sprintf("%s %q stream=%s seq=%s subject=%s k=%s", m.Header.Get("Status"), m.Data,
				m.Header.Get("Nats-Stream"), m.Header.Get("Nats-Sequence"), m.Header.Get("Nats-Subject"), m.Header.Get("K"))
		}
		if got[ours] != got[theirs] {
			t.Errorf("direct get %s of the mirrored stream:\njetgres   %s\njetstream %s", req, got[ours], got[theirs])
		}
	}
}
