package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat times.
var clockTicks = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}()

// procTimes reads a process's /proc/<pid>/stat: its parent and its user +
// system CPU seconds, and those of its waited-for children that exited.
func procTimes(pid int) (ppid int, self, children float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name (field 2) may hold spaces; fields restart after ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("proc %d: odd stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field N is f[N-3].
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("proc %d: short stat", pid)
	}
	num := func(n int) float64 { v, _ := strconv.ParseFloat(f[n-3], 64); return v }
	ppid, _ = strconv.Atoi(f[4-3])
	return ppid, (num(14) + num(15)) / clockTicks, (num(16) + num(17)) / clockTicks, nil
}

// CPUSample is cumulative CPU seconds of the processes the bench watches.
type CPUSample struct {
	Mandated float64 `json:"mandated"` // the mandated (or K1 pipe) child
	Broker   float64 `json:"broker"`
	Postgres float64 `json:"postgres"` // postmaster, every backend and exited ones
	Bench    float64 `json:"bench"`    // this process: load generator and counters
	// Postgres2 is the second PostgreSQL server (shard b), the same way;
	// sampled only for the runs that use it (the 2-shard S1).
	Postgres2 float64 `json:"postgres_2,omitempty"`
}

// Sub returns s - o.
func (s CPUSample) Sub(o CPUSample) CPUSample {
	return CPUSample{Mandated: s.Mandated - o.Mandated, Broker: s.Broker - o.Broker, Postgres: s.Postgres - o.Postgres,
		Postgres2: s.Postgres2 - o.Postgres2, Bench: s.Bench - o.Bench}
}

// System is the CPU of the system under test: mandated, broker, PostgreSQL
// (both servers when there are two).
func (s CPUSample) System() float64 { return s.Mandated + s.Broker + s.Postgres + s.Postgres2 }

// cpuWatch knows the pids to read.
type cpuWatch struct {
	brokerPID     int
	postmasterPID int
	// postmaster2PID is the second PostgreSQL's; zero: not sampled (the
	// runs on one database leave it idle, and its idle CPU is nobody's).
	postmaster2PID int
}

func (w cpuWatch) sample(childPID int) CPUSample {
	var s CPUSample
	if childPID > 0 {
		_, s.Mandated, _, _ = procTimes(childPID)
	}
	_, s.Broker, _, _ = procTimes(w.brokerPID)
	_, s.Bench, _, _ = procTimes(os.Getpid())
	if w.postmasterPID > 0 || w.postmaster2PID > 0 {
		ents, _ := os.ReadDir("/proc")
		s.Postgres = postgresCPU(w.postmasterPID, ents)
		s.Postgres2 = postgresCPU(w.postmaster2PID, ents)
	}
	return s
}

// postgresCPU is a PostgreSQL server's CPU seconds: its postmaster's, its
// exited children's, and those of every live child (backends, walwriter,
// checkpointer...). Zero for pid 0.
func postgresCPU(postmaster int, procs []os.DirEntry) float64 {
	if postmaster <= 0 {
		return 0
	}
	_, self, kids, err := procTimes(postmaster)
	if err != nil {
		return 0
	}
	total := self + kids
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, self, _, err := procTimes(pid)
		if err == nil && ppid == postmaster {
			total += self
		}
	}
	return total
}

// readPIDFile reads the first line of a pid file.
func readPIDFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}
