package leaf

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// FuzzParser checks that the parser never panics, fails only with
// ErrProtocol, and decodes the same ops however the input is split.
func FuzzParser(f *testing.F) {
	for _, frame := range realFrames {
		f.Add([]byte(frame), uint16(7))
	}
	f.Add([]byte(strings.Join(realFrames, "")), uint16(3))
	f.Add([]byte("LMSG a 99999\r\nshort"), uint16(1))
	f.Add([]byte("HMSG a r 5 3\r\nabc\r\n"), uint16(2))
	f.Add([]byte("LS+ a q 999999999999\r\nLS- a q\r\n"), uint16(5))

	f.Fuzz(func(t *testing.T, input []byte, step uint16) {
		whole, wholeErr := parseChunks(input)
		if wholeErr != nil && !errors.Is(wholeErr, ErrProtocol) {
			t.Fatalf("error does not wrap ErrProtocol: %v", wholeErr)
		}
		// Cut the input every step bytes (at least one).
		n := int(step%64) + 1
		var cuts []int
		for c := n; c < len(input); c += n {
			cuts = append(cuts, c)
		}
		split, splitErr := parseChunks(input, cuts...)
		if (wholeErr == nil) != (splitErr == nil) {
			t.Fatalf("whole err %v, split every %d err %v", wholeErr, n, splitErr)
		}
		// A failing input may fail at different points when split (a too
		// long line is noticed sooner or later), but the ops before the
		// failure must agree.
		if wholeErr == nil && !reflect.DeepEqual(whole, split) {
			t.Fatalf("split every %d changes the ops:\nwhole %+v\nsplit %+v", n, whole, split)
		}
		if wholeErr != nil {
			k := min(len(whole), len(split))
			if !reflect.DeepEqual(whole[:k], split[:k]) {
				t.Fatalf("split every %d changes the ops before the failure", n)
			}
		}
	})
}
