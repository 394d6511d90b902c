package jsonrecords

import (
	"encoding/json"
	"testing"
)

// Records are valid JSON of the size asked for, and no two are alike.
func TestRecordSizes(t *testing.T) {
	g := New(1)
	seen := map[string]bool{}
	for _, size := range []int{400, 1024, 1024, 4096, 16384, 1 << 20} {
		b := g.Record(size)
		if len(b) != size {
			t.Errorf("record of %d bytes, want %d: %s", len(b), size, b)
		}
		if !json.Valid(b) {
			t.Errorf("record is not JSON: %s", b)
		}
		if seen[string(b)] {
			t.Errorf("record repeated: %s", b)
		}
		seen[string(b)] = true
	}
}
