package leaf

import (
	"strings"
	"testing"
)

// TestValidLiteralEveryByte checks the word-at-a-time validLiteral against the byte rule
// for every byte value at every position of a word and of the tail after the last word.
func TestValidLiteralEveryByte(t *testing.T) {
	for n := 1; n <= 19; n++ {
		for pos := range n {
			for c := range 256 {
				b := []byte(strings.Repeat("a", n))
				b[pos] = byte(c)
				want := c > ' ' && c != 0x7f
				if got := validLiteral(string(b)); got != want {
					t.Fatalf("validLiteral(%q) = %v, want %v", b, got, want)
				}
			}
		}
	}
	if validLiteral("") {
		t.Fatal(`validLiteral("") = true`)
	}
}
