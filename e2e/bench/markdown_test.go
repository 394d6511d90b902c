package bench

import "testing"

// Regenerating the page keeps what only another run writes, the soak's section say, and
// replaces what this run writes.
func TestKeepOtherSections(t *testing.T) {
	old := "# Benchmarks\n\nold intro\n\n## Results\n\nold results\n\n## A day of load\n\nsoak text\n\n```\n## not a heading, inside a fence\n```\n\n![rss](docs/soak/rss.png)\n"
	generated := "# Benchmarks\n\nnew intro\n\n## Results\n\nnew results\n"
	want := "# Benchmarks\n\nnew intro\n\n## Results\n\nnew results\n\n## A day of load\n\nsoak text\n\n```\n## not a heading, inside a fence\n```\n\n![rss](docs/soak/rss.png)\n"
	if got := string(keepOtherSections([]byte(old), []byte(generated))); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := string(keepOtherSections(nil, []byte(generated))); got != generated {
		t.Errorf("without a page before, got\n%s\nwant\n%s", got, generated)
	}
}
