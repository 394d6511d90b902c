package jsapi

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeListsUnsupported keeps the README's list of what jetgres does not serve true.
func TestReadmeListsUnsupported(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Not supported\n")
	if !ok {
		t.Fatal(`README has no "## Not supported" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, u := range unsupportedRequests {
		if !strings.Contains(section, "`"+u.name+"`") {
			t.Errorf("README's Not supported section does not list %s", u.name)
		}
	}
}
