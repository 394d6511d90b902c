package purgemove

import "testing"

// The moves nats-server makes after a purge of a subject, by how a consumer's filters
// relate to it.
func TestPlanForFilters(t *testing.T) {
	p := Plan{subject: "orders.>", first: 10, left: 15, last: 20}
	for _, tc := range []struct {
		name    string
		filters []string
		ok      bool
		start   uint64
		wider   bool
	}{
		{"equal", []string{"orders.>"}, true, 15, false},
		{"inside", []string{"orders.eu", "orders.us.*"}, true, 15, false},
		{"no filters", nil, true, 10, true},
		{"wider", []string{">"}, true, 10, true},
		{"inside and elsewhere", []string{"orders.eu", "billing.>"}, true, 10, true},
		{"elsewhere", []string{"billing.>"}, false, 0, false},
		{"partly overlapping", []string{"*.eu"}, false, 0, false},
	} {
		move, ok := p.For(tc.filters)
		if ok != tc.ok {
			t.Fatalf("%s: moved %v, want %v", tc.name, ok, tc.ok)
		}
		if !ok {
			continue
		}
		if move.Start != tc.start || move.Wider != tc.wider || move.Last != 20 {
			t.Fatalf("%s: move %+v, want start %d, wider %v, last 20", tc.name, move, tc.start, tc.wider)
		}
	}
	all := Plan{first: 10, left: 10, last: 20}
	if move, ok := all.For([]string{"billing.>"}); !ok || move.Start != 10 || move.Wider {
		t.Fatalf("a purge of every subject moved %+v, %v", move, ok)
	}
}
