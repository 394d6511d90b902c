package bridge

import (
	"maps"
	"slices"
	"testing"

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
