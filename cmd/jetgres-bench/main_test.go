package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsage checks the command lines that must be refused, or answered with help, before
// anything is started.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"-h"}, 0, "-out-dir"},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined"},
		{[]string{"pub"}, 2, `unexpected argument "pub"`},
		{[]string{"--log-level", "loud"}, 2, "--log-level"},
		{[]string{"--msgs", "x"}, 2, "invalid value"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.inStderr) {
			t.Errorf("run(%q) = %d, stderr %q; want %d and %q in stderr", tc.args, code, stderr.String(), tc.code, tc.inStderr)
		}
		if stdout.Len() != 0 {
			t.Errorf("run(%q) wrote %q to stdout; a refused command line prints no report", tc.args, stdout.String())
		}
	}
}
