package jswire

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// Two filters of one consumer may not overlap where one covers the other; filters that
// only cross (each matches subjects the other does not) are allowed, as in nats-server.
func TestConsumerFilterOverlap(t *testing.T) {
	overlapCode := server.NewJSConsumerOverlappingSubjectFiltersError().ErrCode
	scfg := server.StreamConfig{Name: "S", Subjects: []string{">"}, Replicas: 1}
	for _, c := range []struct {
		a, b    string
		overlap bool
	}{
		{"a.b", "a.c", false},
		{"a.b", "a.b.c", false},
		{"a.*", "a.b", true},
		{"a.b", "a.*", true},
		{"a.*", "a.*.c", false},
		{"a.>", "a.b", true},
		{"a.>", "a.b.c.d", true},
		{"a.>", "a", false},
		{"a.>", "a.*", true},
		{"a.*", "a.>", true},
		{"*.b", "a.*", false}, // they cross at a.b, but each matches what the other does not
		{"a.*.c", "a.b.*", false},
		{"*.*", "a.b", true},
		{"*.*", "a.b.c", false},
		{">", "a", true},
		{"*", "a.b", false},
		{"a.*.>", "a.b.c", true},
		{"a.*.>", "a.b", false},
		{"a.b.>", "a.*.>", true},
	} {
		cfg := server.ConsumerConfig{Durable: "C", AckPolicy: server.AckExplicit, FilterSubjects: []string{c.a, c.b}}
		_, e := CheckConsumerConfig(cfg, &scfg)
		switch {
		case c.overlap && (e == nil || e.ErrCode != overlapCode):
			t.Errorf("filters %q and %q: %v, want them refused as overlapping", c.a, c.b, e)
		case !c.overlap && e != nil:
			t.Errorf("filters %q and %q: %v, want them accepted", c.a, c.b, e)
		}
	}
}
