package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrNoBinaries is returned by Start when the PostgreSQL server binaries cannot be found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (postgres, initdb) not found")

// installAdvice follows ErrNoBinaries. It names what to install and the flag that does without,
// not Config.BinDir, which a user of jetgres cannot set.
const installAdvice = "install them (Debian/Ubuntu: apt-get install postgresql, or a versioned package such as postgresql-15) " +
	"or run jetgres against an existing server with --database-url"

// versionedBinGlobs are the layouts distribution packages install to, which are not on PATH:
// Debian and Ubuntu (/usr/lib/postgresql/15/bin) and the PGDG RPMs (/usr/pgsql-15/bin).
var versionedBinGlobs = []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"}

var serverVersionRE = regexp.MustCompile(`\(PostgreSQL\) (\d+)(?:\.(\d+))?`)

// binaries is a directory holding a matching postgres and initdb.
type binaries struct {
	dir     string
	version string // e.g. "15.18"
	major   int
}

func (b binaries) path(name string) string { return filepath.Join(b.dir, name) }

// findBinaries looks in binDir if it is set (and only there, because an explicit choice that
// does not work should fail loudly), else next to the postgres found on PATH, else in the
// highest versioned distribution directory.
func findBinaries(ctx context.Context, binDir string) (binaries, error) {
	var dir string
	switch {
	case binDir != "":
		if !hasServerBinaries(binDir) {
			return binaries{}, fmt.Errorf("%w in Config.BinDir %s", ErrNoBinaries, binDir)
		}
		dir = binDir
	default:
		dir = binDirFromPath()
		if dir == "" {
			dir = highestVersionedBinDir()
		}
		if dir == "" {
			return binaries{}, fmt.Errorf("%w on PATH or in %s: %s", ErrNoBinaries, strings.Join(versionedBinGlobs, " or "), installAdvice)
		}
	}
	b := binaries{dir: dir}
	out, err := exec.CommandContext(ctx, b.path("postgres"), "--version").Output()
	if err != nil {
		return binaries{}, fmt.Errorf("running %s --version: %w", b.path("postgres"), err)
	}
	m := serverVersionRE.FindSubmatch(out)
	if m == nil {
		return binaries{}, fmt.Errorf("unrecognised output from %s --version: %q", b.path("postgres"), bytesTrim(out))
	}
	b.major, _ = strconv.Atoi(string(m[1]))
	b.version = string(m[1])
	if len(m[2]) > 0 {
		b.version += "." + string(m[2])
	}
	return b, nil
}

// binDirFromPath resolves symlinks because packagers link postgres into a bin directory on
// PATH while initdb, and the version it must match, live next to the real binary.
func binDirFromPath() string {
	p, err := exec.LookPath("postgres")
	if err != nil {
		return ""
	}
	target, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	if dir := filepath.Dir(target); hasServerBinaries(dir) {
		return dir
	}
	return ""
}

func highestVersionedBinDir() string {
	type candidate struct {
		dir     string
		version []int
	}
	var found []candidate
	for _, pattern := range versionedBinGlobs {
		dirs, _ := filepath.Glob(pattern)
		for _, dir := range dirs {
			if !hasServerBinaries(dir) {
				continue
			}
			found = append(found, candidate{dir: dir, version: versionOfDir(dir)})
		}
	}
	if len(found) == 0 {
		return ""
	}
	best := slices.MaxFunc(found, func(a, b candidate) int { return slices.Compare(a.version, b.version) })
	return best.dir
}

// versionOfDir reads the version from the directory name (".../15/bin", ".../pgsql-9.6/bin").
func versionOfDir(dir string) []int {
	name := filepath.Base(filepath.Dir(dir))
	name = name[strings.LastIndexByte(name, '-')+1:]
	var v []int
	for part := range strings.SplitSeq(name, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"postgres", "initdb"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

func bytesTrim(b []byte) string { return strings.TrimSpace(string(b)) }
