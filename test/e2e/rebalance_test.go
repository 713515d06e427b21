package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// load sends proposals at a steady pace until stopped, sometimes sending the
// same intent twice (a retry), and remembers every record it sent.
type load struct {
	h        *harness.Harness
	mandates int
	mu       sync.Mutex
	sent     []harness.Sent
	retried  map[string][]harness.Sent // idempotency key → its sends
	stop     chan struct{}
	done     chan struct{}
}

func startLoad(h *harness.Harness, mandates int, every time.Duration) *load {
	l := &load{h: h, mandates: mandates, retried: map[string][]harness.Sent{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			case <-t.C:
			}
			mandate := fmt.Sprintf("m%d", i%mandates)
			key := fmt.Sprintf("%s-k%d", mandate, i)
			s := h.Send(proposeCmd("acme", mandate, key, 1))
			l.mu.Lock()
			l.sent = append(l.sent, s)
			if i%10 == 0 {
				r := h.Send(proposeCmd("acme", mandate, key, 1))
				l.sent = append(l.sent, r)
				l.retried[key] = []harness.Sent{s, r}
			}
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *load) halt() []harness.Sent {
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]harness.Sent(nil), l.sent...)
}

func (l *load) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sent)
}

func epochs(t *testing.T, pool *pgxpool.Pool) map[int32]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT partition, epoch FROM mandated_partitions`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var e int64
		require.NoError(t, rows.Scan(&p, &e))
		out[p] = e
	}
	return out
}

func TestOperatorsRebalanceThreeProcessesUnderLoadWithoutASecondDecision(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 6, Timeout: 3 * time.Minute})
	pool, err := pgxpool.New(context.Background(), h.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	const mandates = 24
	var grants []harness.Sent
	for i := range mandates {
		grants = append(grants, h.Send(grantCmd("acme", fmt.Sprintf("m%d", i), 100000)))
	}
	args := mandatedArgs(h)
	p1 := procs.StartMandated(t, "p1", args, nil)
	p2 := procs.StartMandated(t, "p2", args, nil)
	p3 := procs.StartMandated(t, "p3", args, nil)
	for _, p := range []*procs.Process{p1, p2, p3} {
		p.WaitReady(2 * time.Minute)
	}
	for _, g := range grants {
		require.Equal(t, wire.OutcomeGranted, h.Await(g).Outcome)
	}
	l := startLoad(h, mandates, 15*time.Millisecond)
	waitSent := func(n int) {
		testenv.WaitFor(t, 2*time.Minute, func() bool { return l.count() >= n }, fmt.Sprintf("%d proposals sent", n))
	}
	waitSent(200)
	start := epochs(t, pool)

	p1.Signal(syscall.SIGTERM) // an operator stops one
	code, err := p1.Wait(45 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, "SIGTERM exits 0")
	waitSent(l.count() + 200)

	p2.Kill() // a node dies
	waitSent(l.count() + 200)

	p4 := procs.StartMandated(t, "p4", args, nil) // and one is added back
	p4.WaitReady(2 * time.Minute)
	waitSent(l.count() + 200)
	sent := l.halt()

	// Every proposal is decided (lag back to zero) exactly once.
	bySource := map[wire.Source]int{}
	h.Decisions.WaitRecords(h.Timeout, func(rs []harness.Record) bool {
		clear(bySource)
		for _, r := range rs {
			if r.Decision != nil && r.Decision.Source != nil {
				bySource[*r.Decision.Source]++
			}
		}
		for _, s := range sent {
			if bySource[s.Source()] == 0 {
				return false
			}
		}
		return true
	}, "a decision for every proposal")
	for _, s := range sent {
		require.Equal(t, 1, bySource[s.Source()], "exactly one decision for %+v", s)
	}
	// Retries of one intent got the same authorization.
	for key, pair := range l.retried {
		a, b := h.Await(pair[0]), h.Await(pair[1])
		require.Equal(t, wire.OutcomeReserved, a.Outcome, key)
		require.Equal(t, wire.OutcomeReplayed, b.Outcome, key)
		require.Equal(t, a.AuthorizationID, b.AuthorizationID, key)
	}
	// Per partition, the sequences on the topic are 1..n, each once.
	seqs := map[int32][]int64{}
	for _, r := range h.Decisions.Records() {
		seqs[r.Partition] = append(seqs[r.Partition], r.Seq)
	}
	for p, s := range seqs {
		for i, seq := range s {
			require.Equal(t, int64(i+1), seq, "partition %d", p)
		}
	}
	// Partitions moved and their epochs were bumped. The consumer protocol
	// moves partitions in steps (revoke, then assign) and p2's wait for the
	// session timeout: read the epochs once the survivors hold everything.
	waitOwners(t, pool, 6, "p3", "p4")
	end := epochs(t, pool)
	bumped := 0
	for p, e := range end {
		require.GreaterOrEqual(t, e, start[p])
		if e > start[p] {
			bumped++
		}
	}
	require.Positive(t, bumped)
	var owners []string
	rows, err := pool.Query(context.Background(), `SELECT DISTINCT owner FROM mandated_partitions ORDER BY owner`)
	require.NoError(t, err)
	for rows.Next() {
		var o string
		require.NoError(t, rows.Scan(&o))
		owners = append(owners, o)
	}
	require.Equal(t, []string{"p3", "p4"}, owners, "the surviving and the added processor own everything")

	// What the operator sees: mandatectl partitions shows the movement.
	out, err := exec.Command(procs.Binary(t, "mandatectl"), append([]string{"partitions", "--json"}, ctlArgs(h)...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var rowsOut []map[string]any
	require.NoError(t, json.Unmarshal(out, &rowsOut), "%s", out)
	require.Len(t, rowsOut, 6)
	for _, row := range rowsOut {
		p := int32(row["partition"].(float64))
		require.Contains(t, []any{"p3", "p4"}, row["owner"], "%v", row)
		require.Equal(t, float64(end[p]), row["epoch"], "%v", row)
	}

	// The auditor's view: the chain of every partition continued through
	// the stop, the kill -9 and the takeovers, and the decisions rebuild
	// exactly what PostgreSQL holds.
	vout, err := exec.Command(procs.Binary(t, "mandatectl"), "verify", "--json", "--brokers", joinComma(h.Brokers),
		"--database-url", h.DatabaseURL, "--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter).Output()
	require.NoError(t, err, "%s", vout)
	var report struct {
		Partitions []struct {
			Complete  bool  `json:"complete"`
			Decisions int64 `json:"decisions"`
		} `json:"partitions"`
		Breaks  []any `json:"breaks"`
		Drifts  []any `json:"drifts"`
		Records int64 `json:"records"`
	}
	require.NoError(t, json.Unmarshal(vout, &report), "%s", vout)
	require.Empty(t, report.Breaks)
	require.Empty(t, report.Drifts)
	require.Len(t, report.Partitions, 6)
	for _, p := range report.Partitions {
		require.True(t, p.Complete)
	}
	require.GreaterOrEqual(t, report.Records, int64(len(sent)+mandates))
	t.Logf("%d proposals, %d partitions re-claimed, epochs %v → %v; verify checked %d records", len(sent), bumped, start, end, report.Records)
}
