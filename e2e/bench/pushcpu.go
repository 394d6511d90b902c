package bench

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, which Linux fixes
// at 100 on every architecture Go runs on.
const clockTicks = 100

// cpuSample is the CPU time used so far by this process (jetgres, its NATS server and link,
// JetStream and every client of the bench live in it) and by the PostgreSQL server.
type cpuSample struct {
	proc, pg time.Duration
	pgOK     bool
}

// cpuMeter reads the CPU time of this process and of the PostgreSQL server it measures. The
// server's time is read from /proc, which only works when it runs on this machine as a user
// whose processes this one may read; without it, the report gives the process's time alone.
type cpuMeter struct {
	postmaster int // 0 when the server's processes cannot be read
}

// newCPUMeter finds the postmaster through its data directory's pid file.
func (r *runner) newCPUMeter(ctx context.Context) *cpuMeter {
	m := &cpuMeter{}
	dir, err := r.probe.Setting(ctx, "data_directory")
	if err != nil {
		return m
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return m
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid > 0 {
		if _, _, ok := procCPU(pid); ok {
			m.postmaster = pid
		}
	}
	return m
}

// sample reads both clocks now.
func (m *cpuMeter) sample() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.proc = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if m.postmaster == 0 {
		return s
	}
	// The postmaster's own time and that of the children it reaped (backends that exited),
	// plus that of every child still running.
	own, reaped, ok := procCPU(m.postmaster)
	if !ok {
		return s
	}
	s.pg, s.pgOK = own+reaped, true
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return cpuSample{proc: s.proc}
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == m.postmaster {
			continue
		}
		if ppid, ok := procParent(pid); ok && ppid == m.postmaster {
			if t, _, ok := procCPU(pid); ok {
				s.pg += t
			}
		}
	}
	return s
}

// since is the CPU time used from s0 to s.
func (s cpuSample) since(s0 cpuSample) cpuSample {
	d := cpuSample{proc: s.proc - s0.proc, pgOK: s.pgOK && s0.pgOK}
	if d.pgOK {
		d.pg = s.pg - s0.pg
	}
	return d
}

// add sums two spans; the zero sample is the empty sum.
func (s cpuSample) add(d cpuSample) cpuSample {
	if s == (cpuSample{}) {
		return d
	}
	return cpuSample{proc: s.proc + d.proc, pg: s.pg + d.pg, pgOK: s.pgOK && d.pgOK}
}

// procStat returns the fields of /proc/<pid>/stat after the command name, which may hold
// spaces: field 3 (state) is at index 0.
func procStat(pid int) ([]string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(b[i+1:])), true
}

// procCPU is a process's own user and system time, and that of the children it waited for.
func procCPU(pid int) (own, reaped time.Duration, ok bool) {
	f, ok := procStat(pid)
	if !ok || len(f) < 15 {
		return 0, 0, false
	}
	// utime, stime, cutime, cstime are fields 14 to 17.
	var v [4]int64
	for i := range v {
		n, err := strconv.ParseInt(f[11+i], 10, 64)
		if err != nil {
			return 0, 0, false
		}
		v[i] = n
	}
	tick := time.Second / clockTicks
	return time.Duration(v[0]+v[1]) * tick, time.Duration(v[2]+v[3]) * tick, true
}

// procParent is a process's parent pid (field 4).
func procParent(pid int) (int, bool) {
	f, ok := procStat(pid)
	if !ok || len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// cpuCores is how many cores the process may use: the machine's, or fewer when a cgroup
// quota caps it.
func cpuCores() float64 {
	cores := float64(runtime.NumCPU())
	b, err := os.ReadFile("/sys/fs/cgroup/cpu.max")
	if err != nil {
		return cores
	}
	quota, period, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !ok || quota == "max" {
		return cores
	}
	q, err1 := strconv.ParseFloat(quota, 64)
	p, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return cores
	}
	return min(cores, q/p)
}
