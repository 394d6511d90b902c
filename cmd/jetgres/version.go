package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// buildInfo is what `jetgres version` prints and what jetgres_build_info labels.
type buildInfo struct {
	Version   string // module version, "(devel)" for a build from a work tree
	Revision  string // VCS commit, empty when the build did not stamp it
	Time      string // VCS commit time
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: "(unknown)", GoVersion: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if info.Main.Version != "" {
		b.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

func (b buildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "jetgres %s\n", b.Version)
	fmt.Fprintf(&s, "go       %s\n", b.GoVersion)
	if b.Revision != "" {
		mod := ""
		if b.Modified {
			mod = " (modified)"
		}
		fmt.Fprintf(&s, "revision %s%s\n", b.Revision, mod)
	}
	if b.Time != "" {
		fmt.Fprintf(&s, "time     %s\n", b.Time)
	}
	return s.String()
}
