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
}

// Sub returns s - o.
func (s CPUSample) Sub(o CPUSample) CPUSample {
	return CPUSample{s.Mandated - o.Mandated, s.Broker - o.Broker, s.Postgres - o.Postgres, s.Bench - o.Bench}
}

// System is the CPU of the system under test: mandated, broker, PostgreSQL.
func (s CPUSample) System() float64 { return s.Mandated + s.Broker + s.Postgres }

// cpuWatch knows the pids to read.
type cpuWatch struct {
	brokerPID     int
	postmasterPID int
}

func (w cpuWatch) sample(childPID int) CPUSample {
	var s CPUSample
	if childPID > 0 {
		_, s.Mandated, _, _ = procTimes(childPID)
	}
	_, s.Broker, _, _ = procTimes(w.brokerPID)
	_, s.Bench, _, _ = procTimes(os.Getpid())
	if w.postmasterPID > 0 {
		_, self, kids, err := procTimes(w.postmasterPID)
		if err == nil {
			s.Postgres = self + kids
		}
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			ppid, self, _, err := procTimes(pid)
			if err == nil && ppid == w.postmasterPID {
				s.Postgres += self
			}
		}
	}
	return s
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
