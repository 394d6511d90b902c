package pg

import "testing"

// Only appends lead from one state to another when the first sequence stayed and every new
// sequence is one more live message; any removal shows as fewer messages than sequences.
func TestAppendedTo(t *testing.T) {
	p := statePin{first: 3, last: 10, msgs: 7, bytes: 700}
	for _, tc := range []struct {
		name string
		q    statePin
		want bool
	}{
		{"unchanged", p, true},
		{"two appends", statePin{3, 12, 9, 900}, true},
		{"an append and a removal", statePin{3, 12, 8, 800}, false},
		{"a removal", statePin{3, 10, 6, 600}, false},
		{"first moved", statePin{4, 11, 7, 700}, false},
		{"emptied past the last", statePin{3, 20, 0, 0}, false},
	} {
		if got := p.appendedTo(tc.q); got != tc.want {
			t.Errorf("%s: appendedTo %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A set that would take the remembered sets past SubjectCountBytes is not kept, and that
// is counted; the count itself is.
func TestSubjectCountBound(t *testing.T) {
	s := newSubjectCounts()
	small := &subjectCount{n: 1, set: map[string]struct{}{"a": {}}, cost: 1 + subjectCost}
	s.put(1, small)
	big := &subjectCount{n: 2, set: map[string]struct{}{"b": {}, "c": {}}, cost: SubjectCountBytes}
	s.put(2, big)
	if got := s.dropped.Load(); got != 1 {
		t.Fatalf("dropped %d, want 1", got)
	}
	if c := s.take(2); c == nil || c.set != nil || c.n != 2 {
		t.Fatalf("stream 2 kept %+v, want its count without its set", c)
	}
	if c := s.take(1); c == nil || c.set == nil {
		t.Fatalf("stream 1 kept %+v, want its set", c)
	}
	if s.cost != 0 {
		t.Fatalf("%d bytes counted with nothing kept", s.cost)
	}
}
