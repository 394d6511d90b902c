package localpg

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeBinDir makes a directory holding executable postgres and initdb stand-ins.
func fakeBinDir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"postgres", "initdb"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// Not parallel: it swaps the package's search globs and PATH.
func TestBinarySearch(t *testing.T) {
	saved := versionedBinGlobs
	t.Cleanup(func() { versionedBinGlobs = saved })
	root := t.TempDir()
	t.Setenv("PATH", t.TempDir())
	versionedBinGlobs = []string{filepath.Join(root, "postgresql/*/bin"), filepath.Join(root, "pgsql-*/bin")}

	_, err := findBinaries(t.Context(), "")
	if !errors.Is(err, ErrNoBinaries) {
		t.Errorf("nothing installed: %v, want ErrNoBinaries", err)
	}
	// jetgres cannot set Config.BinDir, so the advice is what to install or which flag to use.
	for _, want := range []string{"apt-get install postgresql", "postgresql-15", "--database-url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "Config.BinDir") {
		t.Errorf("error %q names Config.BinDir, which was not set", err)
	}

	for _, dir := range []string{"postgresql/9.6/bin", "postgresql/13/bin", "pgsql-10/bin"} {
		fakeBinDir(t, filepath.Join(root, dir))
	}
	if err := os.MkdirAll(filepath.Join(root, "postgresql/16/bin"), 0o755); err != nil { // no binaries
		t.Fatal(err)
	}
	if got, want := highestVersionedBinDir(), filepath.Join(root, "postgresql/13/bin"); got != want {
		t.Errorf("highestVersionedBinDir() = %s, want %s", got, want)
	}

	// A postgres on PATH (here through a symlink, as packagers install it) wins.
	onPath := t.TempDir()
	target := filepath.Join(root, "pgsql-10/bin")
	if err := os.Symlink(filepath.Join(target, "postgres"), filepath.Join(onPath, "postgres")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", onPath)
	if got := binDirFromPath(); got != target {
		t.Errorf("binDirFromPath() = %s, want %s", got, target)
	}
}

func TestVersionOfDir(t *testing.T) {
	for dir, want := range map[string][]int{
		"/usr/lib/postgresql/15/bin": {15},
		"/usr/pgsql-9.6/bin":         {9, 6},
		"/opt/odd/bin":               nil,
	} {
		if got := versionOfDir(dir); !slices.Equal(got, want) {
			t.Errorf("versionOfDir(%s) = %v, want %v", dir, got, want)
		}
	}
}
