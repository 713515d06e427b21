package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// StatementCPU is what one statement cost PostgreSQL's backends in CPU over
// a level, measured by PostgreSQL itself around every protocol message
// (log_statement_stats: getrusage before and after each parse, bind and
// execute message and each simple query), so that it is CPU, not the wall
// time pg_stat_statements reports, and a machine shared with other load
// does not inflate it.
type StatementCPU struct {
	Name  string `json:"name"`
	Query string `json:"query"`
	// Per phase: "parse", "bind" (planning with the parameters), "execute"
	// (triggers included), "query" (a simple-protocol statement: BEGIN,
	// COMMIT).
	Calls   map[string]int64   `json:"calls"`
	CPUSecs map[string]float64 `json:"cpu_seconds"`
}

// Total is the statement's CPU over every phase.
func (s StatementCPU) Total() float64 {
	var t float64
	for _, v := range s.CPUSecs {
		t += v
	}
	return t
}

// StatementCPUs is one level's statement CPU diagnosis.
type StatementCPUs struct {
	Statements []StatementCPU `json:"statements"` // most CPU first
	// Logged is the backends' CPU inside the messages; Between their CPU
	// between messages (reading the socket, waiting, statistics), from the
	// cumulative totals each message reports; both in seconds.
	Logged   float64 `json:"logged_seconds"`
	Between  float64 `json:"between_seconds"`
	Backends int     `json:"backends"`
	Messages int64   `json:"messages"`
}

// statementStats turns PostgreSQL's per-message CPU logging on (off) for
// the bench's first server. The log line prefix names the backend, so the
// messages of each can be paired.
func (b *Bench) statementStats(ctx context.Context, on bool) error {
	qs := []string{`ALTER SYSTEM RESET log_statement_stats`, `ALTER SYSTEM RESET log_line_prefix`}
	if on {
		qs = []string{`ALTER SYSTEM SET log_statement_stats = on`, `ALTER SYSTEM SET log_line_prefix = '%p %l '`}
	}
	for _, q := range append(qs, `SELECT pg_reload_conf()`) {
		if err := b.pg.exec(ctx, "postgres", q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// serverLog is the bench PostgreSQL's log (test/infra/postgres.sh: beside
// the data directory).
func (b *Bench) serverLog() string {
	return filepath.Join(filepath.Dir(b.cfg.PGDataDir), "postgres.log")
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

var (
	logLine   = regexp.MustCompile(`^(\d+) \d+ ([A-Z]+):  (.*)$`)
	usageLine = regexp.MustCompile(`^\s*!\s+([0-9.]+) s user, ([0-9.]+) s system, ([0-9.]+) s elapsed`)
	totalLine = regexp.MustCompile(`^\s*!\s+\[([0-9.]+) s user, ([0-9.]+) s system total\]`)
)

// parseStatementStats reads the server log from offset from to to and sums
// each statement's CPU by phase. name names a statement from its text.
func parseStatementStats(path string, from, to int64, name func(string) string) (StatementCPUs, error) {
	var out StatementCPUs
	f, err := os.Open(path)
	if err != nil {
		return out, err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.NewSectionReader(f, from, to-from))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	type msg struct {
		phase       string
		cpu         float64
		total       float64
		haveUse     bool
		stmt        strings.Builder
		inStatement bool
	}
	type backend struct {
		first, last float64 // cumulative CPU before the first message, after the last
		logged      float64
		seen        bool
	}
	cur := map[string]*msg{}
	backends := map[string]*backend{}
	byName := map[string]*StatementCPU{}
	var lastPID string
	flush := func(pid string) {
		m := cur[pid]
		if m == nil || !m.haveUse || m.phase == "" {
			delete(cur, pid)
			return
		}
		delete(cur, pid)
		q := strings.TrimSpace(m.stmt.String())
		n := name(q)
		if n == "" {
			n = "`" + trunc(squash(q), 60) + "`"
		}
		s := byName[n]
		if s == nil {
			s = &StatementCPU{Name: n, Query: trunc(squash(q), 160), Calls: map[string]int64{}, CPUSecs: map[string]float64{}}
			byName[n] = s
		}
		s.Calls[m.phase]++
		s.CPUSecs[m.phase] += m.cpu
		out.Logged += m.cpu
		out.Messages++
		be := backends[pid]
		if be == nil {
			be = &backend{}
			backends[pid] = be
		}
		if !be.seen {
			be.first, be.seen = m.total-m.cpu, true
		}
		be.logged += m.cpu
		be.last = m.total
	}
	for sc.Scan() {
		line := sc.Text()
		if mm := logLine.FindStringSubmatch(line); mm != nil {
			pid, level, text := mm[1], mm[2], mm[3]
			if m := cur[pid]; m != nil && m.inStatement {
				flush(pid)
			}
			lastPID = pid
			switch level {
			case "LOG":
				phase := ""
				switch text {
				case "PARSE MESSAGE STATISTICS":
					phase = "parse"
				case "BIND MESSAGE STATISTICS":
					phase = "bind"
				case "EXECUTE MESSAGE STATISTICS":
					phase = "execute"
				case "QUERY STATISTICS":
					phase = "query"
				}
				if phase != "" {
					cur[pid] = &msg{phase: phase}
				}
			case "STATEMENT":
				if m := cur[pid]; m != nil {
					m.inStatement = true
					m.stmt.WriteString(text)
				}
			}
			continue
		}
		m := cur[lastPID]
		if m == nil {
			continue
		}
		switch {
		case m.inStatement:
			m.stmt.WriteByte('\n')
			m.stmt.WriteString(line)
		case usageLine.MatchString(line):
			u := usageLine.FindStringSubmatch(line)
			user, _ := strconv.ParseFloat(u[1], 64)
			sys, _ := strconv.ParseFloat(u[2], 64)
			m.cpu, m.haveUse = user+sys, true
		case totalLine.MatchString(line):
			t := totalLine.FindStringSubmatch(line)
			user, _ := strconv.ParseFloat(t[1], 64)
			sys, _ := strconv.ParseFloat(t[2], 64)
			m.total = user + sys
		}
	}
	for pid := range cur {
		flush(pid)
	}
	for _, be := range backends {
		out.Between += be.last - be.first - be.logged
	}
	out.Backends = len(backends)
	for _, s := range byName {
		out.Statements = append(out.Statements, *s)
	}
	sort.Slice(out.Statements, func(i, j int) bool { return out.Statements[i].Total() > out.Statements[j].Total() })
	return out, sc.Err()
}

// statementCPUSummary writes the statement CPU table of one level, per
// batch and per call.
func statementCPUSummary(w func(string, ...any), l LatencyResult) {
	d, c := l.StatementCPU, l.Costs
	if d == nil || c == nil || c.Batches <= 0 {
		return
	}
	w("\n### PostgreSQL CPU statement by statement, %s load (a separate run with `log_statement_stats`)\n\n", l.Level)
	w("%.0f batches of %.1f records, %.0f relay transactions; %d backends. CPU measured by PostgreSQL around each protocol message (getrusage), so waiting for a core does not count. *bind* is planning with the parameters; *execute* includes the triggers the statement fires.\n\n",
		c.Batches, c.Decisions/c.Batches, c.RelayTxns, d.Backends)
	w("| statement | group | calls per batch | bind µs per call | execute µs per call | µs per batch | share |\n|---|---|---|---|---|---|---|\n")
	total := d.Logged + d.Between
	for _, s := range d.Statements {
		calls := s.Calls["execute"] + s.Calls["query"]
		if calls == 0 {
			calls = s.Calls["bind"]
		}
		per := func(phase string) string {
			n := s.Calls[phase]
			if phase == "execute" {
				n += s.Calls["query"]
			}
			if n == 0 {
				return "–"
			}
			v := s.CPUSecs[phase]
			if phase == "execute" {
				v += s.CPUSecs["query"]
			}
			return fmt.Sprintf("%.0f", v/float64(n)*1e6)
		}
		w("| %s | %s | %.2f | %s | %s | %.0f | %.1f %% |\n", s.Name, statementGroup(s.Name), float64(calls)/c.Batches, per("bind"), per("execute"),
			s.Total()/c.Batches*1e6, 100*s.Total()/total)
	}
	w("| *between messages* (protocol, socket reads, statistics) | | | | | %.0f | %.1f %% |\n", d.Between/c.Batches*1e6, 100*d.Between/total)
	w("| **all backends** | | | | | **%.0f** | |\n", total/c.Batches*1e6)
}
