package leaf

import (
	"slices"
	"testing"
)

func matches(t *trie[string], subject string) []string {
	var got []string
	t.match(subject, func(v *string) bool {
		got = append(got, *v)
		return true
	})
	slices.Sort(got)
	return got
}

func TestTrieMatch(t *testing.T) {
	var tr trie[string]
	for _, p := range []string{"a", "a.b", "a.*", "a.>", "*.b", ">", "_INBOX.x.*", "a.b>", "x.>.y"} {
		*tr.put(p) = p
	}
	tests := []struct {
		subject string
		want    []string
	}{
		{"a", []string{">", "a"}},
		{"a.b", []string{"*.b", ">", "a.*", "a.>", "a.b"}},
		{"a.c", []string{">", "a.*", "a.>"}},
		{"a.b.c", []string{">", "a.>"}},
		{"b", []string{">"}},
		{"_INBOX.x.123", []string{">", "_INBOX.x.*"}},
		{"_INBOX.x.123.4", []string{">"}},
		{"a.b>", []string{">", "a.*", "a.>", "a.b>"}},
		{"x.>.y", []string{">", "x.>.y"}}, // `>` inside a pattern is a plain token
		{"x.z.y", []string{">"}},
	}
	for _, tt := range tests {
		if got := matches(&tr, tt.subject); !slices.Equal(got, tt.want) {
			t.Errorf("match %q = %v, want %v", tt.subject, got, tt.want)
		}
	}
}

func TestTrieDeletePrunes(t *testing.T) {
	var tr trie[int]
	*tr.put("a.b.c") = 1
	*tr.put("a.*") = 2
	*tr.put("a.>") = 3
	tr.delete("a.b.c")
	if tr.get("a.b.c") != nil {
		t.Fatal("a.b.c still present")
	}
	if v := tr.get("a.*"); v == nil || *v != 2 {
		t.Fatal("a.* lost")
	}
	tr.delete("a.*")
	tr.delete("a.>")
	tr.delete("never.added")
	if !tr.root.empty() {
		t.Fatalf("root not pruned: %+v", tr.root)
	}
}

func TestInterestSemantics(t *testing.T) {
	var in interest
	b := func(s string) []byte { return []byte(s) }

	in.add(b("_INBOX.x.*"), nil)
	in.add(b("jobs"), b("workers"))
	in.add(b("jobs"), b("other"))
	in.add(b("events.>"), nil)
	for subject, want := range map[string]bool{
		"_INBOX.x.abc":   true,
		"_INBOX.x":       false,
		"_INBOX.x.a.b":   false,
		"_INBOX.y.abc":   false,
		"jobs":           true,
		"events":         false,
		"events.a":       true,
		"events.a.b.c.d": true,
	} {
		if got := in.has(subject); got != want {
			t.Errorf("has(%q) = %v, want %v", subject, got, want)
		}
	}

	// The server re-announces a queue group's weight with LS+: that is an
	// update, and a single LS- withdraws the group.
	in.add(b("jobs"), b("workers"))
	in.remove(b("jobs"), b("workers"))
	if !in.has("jobs") {
		t.Fatal("jobs lost while group other still subscribes")
	}
	in.remove(b("jobs"), b("other"))
	if in.has("jobs") {
		t.Fatal("jobs still has interest after both groups left")
	}

	// Likewise a repeated plain LS+ (the server sends it only on 0 -> 1, but
	// it re-sends everything after some account updates).
	in.add(b("_INBOX.x.*"), nil)
	in.remove(b("_INBOX.x.*"), nil)
	if in.has("_INBOX.x.abc") {
		t.Fatal("inbox interest survived LS-")
	}
	in.remove(b("unknown"), nil)
	in.remove(b("events.>"), nil)
	if in.size() != 0 || !in.patterns.root.empty() {
		t.Fatalf("interest not empty: %d keys", in.size())
	}
}

func TestInterestExact(t *testing.T) {
	var in interest
	b := func(s string) []byte { return []byte(s) }
	in.add(b("deliver.a"), nil)
	in.add(b("deliver.b"), b("workers"))
	in.add(b("deliver.*"), nil)
	for _, c := range []struct {
		subject, queue string
		want           bool
	}{
		{"deliver.a", "", true},
		{"deliver.a", "workers", false},
		{"deliver.b", "workers", true},
		{"deliver.b", "", false},
		{"deliver.b", "other", false},
		{"deliver.c", "", false},
		{"deliver.*", "", true},
	} {
		if got := in.hasExact(c.subject, c.queue); got != c.want {
			t.Errorf("hasExact(%q, %q) = %v, want %v", c.subject, c.queue, got, c.want)
		}
	}
	in.remove(b("deliver.b"), b("workers"))
	if in.hasExact("deliver.b", "workers") {
		t.Fatal("queue interest survived LS-")
	}
	if n := testing.AllocsPerRun(100, func() { in.hasExact("_INBOX.bUg5xq2Dl0nIzXlO4NIoiAa2", "a-long-deliver-group-name") }); n != 0 {
		t.Fatalf("hasExact allocates %v times per call", n)
	}
}

func BenchmarkHasInterest(b *testing.B) {
	var in interest
	for i := range 1000 {
		in.add([]byte("_INBOX.client"+string(rune('a'+i%26))+string(rune('a'+i/26))+".*"), nil)
	}
	in.add([]byte("$JS.API.>"), nil)
	b.ReportAllocs()
	for b.Loop() {
		if !in.has("_INBOX.clientqa.xyz123") {
			b.Fatal("no interest")
		}
	}
}
