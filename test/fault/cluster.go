package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mandated/mandated/test/procs"
)

// Events records what happened to the system, when.
type Events struct {
	start time.Time
	mu    sync.Mutex
	list  []Event
}

// Event is one injected fault, heal or observation.
type Event struct {
	At     time.Duration `json:"at"`
	Fault  string        `json:"fault"`
	Action string        `json:"action"`
	Target string        `json:"target,omitempty"`
	Err    string        `json:"error,omitempty"`
}

func newEvents() *Events { return &Events{start: time.Now()} }

// Add records an event.
func (e *Events) Add(fault, action, target string, err error) {
	ev := Event{At: time.Since(e.start).Round(time.Millisecond), Fault: fault, Action: action, Target: target}
	if err != nil {
		ev.Err = err.Error()
	}
	e.mu.Lock()
	e.list = append(e.list, ev)
	e.mu.Unlock()
}

// List returns the events so far.
func (e *Events) List() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.list...)
}

// Cluster is a set of supervised mandated processes: one that exits when it
// should be running (a failpoint kill, a crash) is restarted.
type Cluster struct {
	t       testing.TB
	args    []string
	events  *Events
	mu      sync.Mutex
	members map[string]*member
	next    int
	stop    chan struct{}
	done    chan struct{}
	logs    []string // log files of every process that ran
	metrics map[string]map[string]float64
	maxLag  float64 // the highest total consumer lag seen in one scrape round
}

type member struct {
	name     string
	env      []string
	p        *procs.Process
	wanted   bool
	restarts int
}

// NewCluster supervises mandated processes started with args.
func NewCluster(t testing.TB, args []string, events *Events) *Cluster {
	c := &Cluster{t: t, args: args, events: events, members: map[string]*member{}, stop: make(chan struct{}),
		done: make(chan struct{}), metrics: map[string]map[string]float64{}}
	go c.supervise()
	t.Cleanup(c.Close)
	return c
}

// Close stops supervising, scrapes the processes one last time and kills
// them all.
func (c *Cluster) Close() {
	select {
	case <-c.stop:
		return
	default:
	}
	close(c.stop)
	<-c.done
	c.scrape()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.p != nil {
			m.p.Signal(syscall.SIGCONT)
			m.p.Kill()
		}
	}
}

// Add starts a new member with extra env (failpoints).
func (c *Cluster) Add(env ...string) string {
	c.mu.Lock()
	defer c.mu.Unlock() // startLocked may end the goroutine (t.Fatal): Close must still lock
	c.next++
	name := fmt.Sprintf("w%d", c.next)
	m := &member{name: name, env: env, wanted: true}
	c.members[name] = m
	c.startLocked(m)
	return name
}

func (c *Cluster) startLocked(m *member) {
	run := fmt.Sprintf("%s.%d", m.name, m.restarts)
	m.p = procs.StartMandated(c.t, run, append(append([]string(nil), c.args...), "--owner", m.name), m.env)
	c.logs = append(c.logs, m.p.LogPath)
}

// WaitReady waits until every wanted member answers /readyz.
func (c *Cluster) WaitReady(timeout time.Duration) {
	c.mu.Lock()
	var ps []*procs.Process
	for _, m := range c.members {
		if m.wanted {
			ps = append(ps, m.p)
		}
	}
	c.mu.Unlock()
	for _, p := range ps {
		p.WaitReady(timeout)
	}
}

// Names returns the wanted members.
func (c *Cluster) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n, m := range c.members {
		if m.wanted {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Pick returns a random wanted member ("" if none).
func (c *Cluster) Pick(rng *rand.Rand) string {
	names := c.Names()
	if len(names) == 0 {
		return ""
	}
	return names[rng.IntN(len(names))]
}

// Signal sends sig to a member.
func (c *Cluster) Signal(name string, sig syscall.Signal) {
	// m.p is replaced under the lock when the supervisor restarts a member.
	c.mu.Lock()
	var p *procs.Process
	if m := c.members[name]; m != nil {
		p = m.p
	}
	c.mu.Unlock()
	if p != nil {
		p.Signal(sig)
	}
}

// Stopped reports whether a member's process is stopped (SIGSTOP).
func (c *Cluster) Stopped(name string) bool {
	c.mu.Lock()
	m := c.members[name]
	c.mu.Unlock()
	return m != nil && m.p != nil && m.p.Stopped()
}

// Remove stops a member gracefully and stops supervising it.
func (c *Cluster) Remove(name string) error {
	c.mu.Lock()
	m := c.members[name]
	if m == nil || !m.wanted {
		c.mu.Unlock()
		return nil
	}
	m.wanted = false
	p := m.p
	c.mu.Unlock()
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	code, err := p.Wait(60 * time.Second)
	if err != nil {
		p.Kill()
		return err
	}
	if code != 0 {
		return fmt.Errorf("%s exited %d after SIGTERM", name, code)
	}
	return nil
}

func (c *Cluster) supervise() {
	defer close(c.done)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	scrape := time.NewTicker(time.Second)
	defer scrape.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-scrape.C:
			c.scrape()
		case <-t.C:
		}
		c.restartExited()
	}
}

// restartExited starts again every wanted member that exited. Once the
// test is over, starting one fails the test and ends this goroutine
// (t.Fatal): the deferred unlock lets Close finish then.
func (c *Cluster) restartExited() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.wanted && m.p.Exited() {
			code := m.p.ExitCode()
			c.events.Add("process_exit", "restart", m.name, fmt.Errorf("exit code %d: %s", code, lastLine(m.p.Log())))
			m.restarts++
			c.startLocked(m)
		}
	}
}

// scrape keeps the last value of chosen counters of every process run, so
// that counters of killed processes still count.
func (c *Cluster) scrape() {
	c.mu.Lock()
	var ps []*procs.Process
	for _, m := range c.members {
		if m.p != nil && !m.p.Exited() {
			ps = append(ps, m.p)
		}
	}
	c.mu.Unlock()
	for _, p := range ps {
		code, body, err := p.Get("/metrics")
		if err != nil || code != http.StatusOK {
			continue
		}
		vals := map[string]float64{}
		for _, line := range strings.Split(body, "\n") {
			for _, name := range []string{"mandated_fenced_commits_total", "mandated_batch_retries_total",
				"mandated_outbox_fenced_total", "mandated_consumer_lag_records", "mandated_ambiguous_commits_total",
				"mandated_predecessor_sessions_terminated_total", "mandated_record_faults_total"} {
				if strings.HasPrefix(line, name) {
					var v float64
					if _, err := fmt.Sscanf(line[strings.LastIndex(line, " ")+1:], "%g", &v); err == nil {
						vals[name] += v
					}
				}
			}
		}
		c.mu.Lock()
		c.metrics[p.Name] = vals
		c.mu.Unlock()
	}
	c.mu.Lock()
	var lag float64
	for _, p := range ps {
		lag += c.metrics[p.Name]["mandated_consumer_lag_records"]
	}
	c.maxLag = max(c.maxLag, lag)
	c.mu.Unlock()
}

// Readyz returns the /readyz answers of the running members, "name: body".
func (c *Cluster) Readyz() []string {
	c.mu.Lock()
	var ps []*procs.Process
	for _, m := range c.members {
		if m.p != nil && !m.p.Exited() {
			ps = append(ps, m.p)
		}
	}
	c.mu.Unlock()
	var out []string
	for _, p := range ps {
		code, body, err := p.Get("/readyz")
		if err != nil {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %d %s", p.Name, code, strings.TrimSpace(body)))
	}
	return out
}

// MaxLag returns the highest total consumer lag seen.
func (c *Cluster) MaxLag() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxLag
}

// Metric sums the last scraped value of a counter over every process run.
func (c *Cluster) Metric(name string) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum float64
	for _, vals := range c.metrics {
		sum += vals[name]
	}
	return sum
}

// MetricByMember returns a counter's last value per member, summed over
// every run of the member (a restarted member's runs are "<name>.<n>").
func (c *Cluster) MetricByMember(name string) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for member := range c.members {
		out[member] = 0
	}
	for run, vals := range c.metrics {
		member, _, _ := strings.Cut(run, ".")
		out[member] += int(vals[name])
	}
	return out
}

// LogCount counts log lines containing s across every process that ran.
func (c *Cluster) LogCount(s string) int {
	c.mu.Lock()
	logs := append([]string(nil), c.logs...)
	c.mu.Unlock()
	n := 0
	for _, path := range logs {
		b, err := readFile(path)
		if err != nil {
			continue
		}
		n += strings.Count(string(b), s)
	}
	return n
}

// Restarts returns how many times members were restarted.
func (c *Cluster) Restarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.members {
		n += m.restarts
	}
	return n
}

var _ = context.Background

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}
