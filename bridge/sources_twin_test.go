package bridge

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// sourced reads every message of a stream on one side as "subject data source-header",
// sorted: two sources interleave as they arrive, so only the set is the same on both sides.
func (tw *twin) sourced(side int, name string) []string {
	tw.t.Helper()
	s, err := tw.js[side].Stream(tw.ctx, name)
	if err != nil {
		tw.t.Fatal(err)
	}
	var out []string
	for seq := uint64(1); seq <= s.CachedInfo().State.LastSeq; seq++ {
		m, err := s.GetMsg(tw.ctx, seq)
		if err != nil {
			continue
		}
		// The last field of the source header is the origin's identity, a hash of its
		// creation time, which differs between the sides.
		src := strings.Fields(m.Header.Get("Nats-Stream-Source"))
		if len(src) == 6 {
			src[5] = fmt.Sprintf("<identity of %d characters>", len(src[5]))
		}
		out = append(out, fmt.Sprintf("%s %q %v", m.Subject, m.Data, src))
	}
	slices.Sort(out)
	return out
}

// sameSourced waits until both sides' stream holds msgs messages, and compares them.
func (tw *twin) sameSourced(name string, msgs uint64) {
	tw.t.Helper()
	tw.settle(name, func(st jetstream.StreamState) bool { return st.Msgs == msgs })
	testwait.For(tw.t, 5*time.Second, func() error {
		a, b := tw.sourced(ours, name), tw.sourced(theirs, name)
		if !slices.Equal(a, b) {
			return fmt.Errorf("stream %s:\njetgres   %s\njetstream %s", name, strings.Join(a, "\n          "), strings.Join(b, "\n          "))
		}
		return nil
	})
}

func TestSourcesTwin(t *testing.T) {
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}})
	tw.createStream(jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}})
	tw.createStream(jetstream.StreamConfig{Name: "C", Subjects: []string{"c.>"}})
	for i := range 5 {
		tw.pub("a.x", fmt.Appendf(nil, "ax%d", i))
	}
	for i := range 3 {
		tw.pub("a.y", fmt.Appendf(nil, "ay%d", i))
	}
	for i := range 4 {
		tw.pub(fmt.Sprintf("b.%d", i), fmt.Appendf(nil, "b%d", i))
	}
	for i := range 3 {
		tw.pub("c.z", fmt.Appendf(nil, "c%d", i))
	}

	for _, bad := range []jetstream.StreamConfig{
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "A.B"}}},
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "A", FilterSubject: "a.x",
			SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "a.y", Destination: "y"}}}}},
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "A", SubjectTransforms: []jetstream.SubjectTransformConfig{
			{Source: "a.>", Destination: "x.>"}, {Source: "a.y", Destination: "y"}}}}},
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "A", SubjectTransforms: []jetstream.SubjectTransformConfig{
			{Source: "a.*", Destination: "{{wildcard(2)}}"}}}}},
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "A", External: &jetstream.ExternalStream{APIPrefix: "$JS.*.API"}}}},
		{Name: "BAD", Sources: []*jetstream.StreamSource{{Name: "A", External: &jetstream.ExternalStream{APIPrefix: "x", DeliverPrefix: "d.*"}}}},
		// A cycle: A sources what it takes itself.
		{Name: "A", Subjects: []string{"a.>"}, Sources: []*jetstream.StreamSource{{Name: "A"}}},
	} {
		var code [2]jetstream.ErrorCode
		for side, js := range tw.js {
			var err error
			if bad.Name == "A" {
				_, err = js.UpdateStream(tw.ctx, bad)
			} else {
				_, err = js.CreateStream(tw.ctx, bad)
			}
			code[side] = errCode(t, side, err)
		}
		if code[ours] != code[theirs] || code[ours] == 0 {
			t.Errorf("%s with sources %+v: jetgres err_code %d, jetstream %d", bad.Name, bad.Sources[0], code[ours], code[theirs])
		}
	}

	sources := []*jetstream.StreamSource{
		{Name: "A", FilterSubject: "a.x"},
		{Name: "B", SubjectTransforms: []jetstream.SubjectTransformConfig{{Source: "b.*", Destination: "t.{{wildcard(1)}}"}}},
	}
	tw.createStream(jetstream.StreamConfig{Name: "S", Subjects: []string{"s.own"}, Sources: sources})
	tw.sameSourced("S", 9)
	tw.copyInfo("S")

	// The stream's own subjects take publishes beside what it sources.
	tw.pub("s.own", []byte("own"))
	tw.pub("a.x", []byte("ax5"))
	tw.pub("b.9", []byte("b9"))
	tw.sameSourced("S", 12)

	// An update adds a source, from the origin's second message on; the others go on
	// where they were, taking nothing twice.
	sources = append(sources, &jetstream.StreamSource{Name: "C", OptStartSeq: 2})
	tw.updateStream(jetstream.StreamConfig{Name: "S", Subjects: []string{"s.own"}, Sources: sources})
	tw.sameSourced("S", 14)
	tw.pub("a.x", []byte("ax6"))
	tw.pub("c.z", []byte("c3"))
	tw.sameSourced("S", 16)
	tw.copyInfo("S")

	// A source from a time takes what was stored from then on.
	from := time.Now()
	tw.pub("a.y", []byte("ay3"))
	tw.createStream(jetstream.StreamConfig{Name: "T", Subjects: []string{"t.own"}, Sources: []*jetstream.StreamSource{
		{Name: "A", FilterSubject: "a.y", OptStartTime: &from}}})
	tw.sameSourced("T", 1)

	// Removing a source stops it.
	tw.updateStream(jetstream.StreamConfig{Name: "S", Subjects: []string{"s.own"}, Sources: sources[1:]})
	tw.pub("a.x", []byte("ax7"))
	tw.pub("b.8", []byte("b8"))
	tw.sameSourced("S", 17)
	tw.copyInfo("S")
}

// TestSourceOriginRecreatedTwin deletes a source's origin and creates it again: once the
// source notices (its consumer went with the origin, so its heartbeats stop), the origin's
// identity differs from the one in the stream's source headers, and the source takes the
// new origin from its start, as in JetStream.
func TestSourceOriginRecreatedTwin(t *testing.T) {
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}})
	for i := range 3 {
		tw.pub("a.x", fmt.Appendf(nil, "old %d", i))
	}
	tw.createStream(jetstream.StreamConfig{Name: "S", Sources: []*jetstream.StreamSource{{Name: "A"}}})
	tw.sameSourced("S", 3)
	for side, js := range tw.js {
		if err := js.DeleteStream(tw.ctx, "A"); err != nil {
			t.Fatalf("%s: %v", sideName[side], err)
		}
	}
	tw.streams = slices.DeleteFunc(tw.streams, func(s string) bool { return s == "A" })
	tw.createStream(jetstream.StreamConfig{Name: "A", Subjects: []string{"a.>"}})
	for i := range 2 {
		tw.pub("a.x", fmt.Appendf(nil, "new %d", i))
	}
	// A health interval, the retry threshold and nats-server's back-off, on both sides.
	testwait.For(t, 90*time.Second, func() error {
		st, err := tw.states("S")
		if err != nil {
			return err
		}
		if st[ours].Msgs != 5 {
			return fmt.Errorf("S holds %d messages", st[ours].Msgs)
		}
		return nil
	})
	tw.sameSourced("S", 5)
}

// A one-shot's purge does not reach a stream that sources the stream it fired in: a
// sourcing stream cannot allow schedules, and keeps the copy of the schedule, on both
// sides.
func TestSourcedSchedulePurgeTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "SO", Subjects: []string{"so.>"}, AllowMsgSchedules: true})
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	tw.pubRaw("so.sched", &nats.Msg{Subject: "so.sched", Header: nats.Header{"Nats-Schedule": {"@at " + at}, "Nats-Schedule-Target": {"so.out"}}, Data: []byte("later")})
	tw.pub("so.other", []byte("kept"))
	tw.createStream(jetstream.StreamConfig{Name: "SC", Sources: []*jetstream.StreamSource{{Name: "SO"}}})
	tw.sameSourced("SC", 2)
	tw.pubRaw("so.out", &nats.Msg{Subject: "so.out", Header: nats.Header{"Nats-Schedule-Next": {"purge"}, "Nats-Scheduler": {"so.sched"}}, Data: []byte("fired")})
	tw.settle("SO", func(st jetstream.StreamState) bool { return st.Msgs == 2 })
	tw.sameSourced("SC", 3)
}
