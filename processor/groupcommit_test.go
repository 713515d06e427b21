package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// groupLog keeps every group commit an instance reports.
type groupLog struct {
	mu    sync.Mutex
	stats []sink.GroupStats
}

func (g *groupLog) hook(cfg *processor.ServiceConfig) {
	cfg.Processor.GroupCommit = true
	cfg.Processor.Test.OnGroupCommit = func(st sink.GroupStats) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.stats = append(g.stats, st)
	}
}

// find returns the first group commit from index from on that matches.
func (g *groupLog) find(from int, match func(sink.GroupStats) bool) (sink.GroupStats, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, st := range g.stats[min(from, len(g.stats)):] {
		if match(st) {
			return st, true
		}
	}
	return sink.GroupStats{}, false
}

func (g *groupLog) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.stats)
}

// homedMandates returns one mandate id of org acme homed on each partition.
func homedMandates(n int32, prefix string) []string {
	ids := make([]string, n)
	for i, found := 0, int32(0); found < n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if p := (partitioner.MandateKey{Org: "acme", MandateID: id}).Partition(n); ids[p] == "" {
			ids[p] = id
			found++
		}
	}
	return ids
}

// load proposes to every mandate, one goroutine per mandate, until stopped.
type load struct {
	once sync.Once
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	sent []harness.Sent
}

func startLoad(t *testing.T, h *harness.Harness, mandates []string, prefix string) *load {
	l := &load{stop: make(chan struct{})}
	t.Cleanup(func() { l.finish() }) // before the harness closes its producer
	for _, m := range mandates {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				s := h.Send(propose("acme", m, fmt.Sprintf("%s-%s-%d", prefix, m, i), 100, nil))
				l.mu.Lock()
				l.sent = append(l.sent, s)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *load) finish() []harness.Sent {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
	return l.sent
}

// answeredOnce waits until every sent record is answered and requires that
// each is answered exactly once, and that every partition's sequences are
// gapless: what the relay published is what was committed, once.
func answeredOnce(t *testing.T, h *harness.Harness, sent []harness.Sent) map[wire.Source]wire.Decision {
	t.Helper()
	want := map[wire.Source]bool{}
	for _, s := range sent {
		want[s.Source()] = true
	}
	recs := h.Decisions.WaitRecords(2*time.Minute, func(rs []harness.Record) bool {
		n := 0
		for _, r := range rs {
			if r.Decision != nil && r.Decision.Source != nil && want[*r.Decision.Source] {
				n++
			}
		}
		return n >= len(want)
	}, fmt.Sprintf("answers to %d records", len(want)))
	answers := map[wire.Source]wire.Decision{}
	seqs := map[int32][]int64{}
	for _, r := range recs {
		seqs[r.Partition] = append(seqs[r.Partition], r.Seq)
		if r.Decision == nil || r.Decision.Source == nil || !want[*r.Decision.Source] {
			continue
		}
		_, dup := answers[*r.Decision.Source]
		require.False(t, dup, "record %+v answered twice", *r.Decision.Source)
		answers[*r.Decision.Source] = *r.Decision
	}
	for p, s := range seqs {
		for i := range s {
			require.Equal(t, int64(i+1), s[i], "partition %d's published sequences are gapless and once each", p)
		}
	}
	return answers
}

// Several partitions of one process commit in one transaction while a
// rival claims one of them: that partition's part fails its fence alone
// (rolled back to its savepoint), the other partitions' batches commit in
// the same transaction, the fenced partition is re-claimed and its records
// decided again by the new epoch, and every decision is published once.
func TestARivalClaimDuringAGroupCommitFailsOnlyThatPartitionAndEveryDecisionIsPublishedOnce(t *testing.T) {
	t.Parallel()
	const n = 4
	var groups groupLog
	h := harness.New(t, harness.Options{Partitions: n, Timeout: 90 * time.Second})
	a := h.Start("a", groups.hook)
	mandates := homedMandates(n, "fence")
	for _, m := range mandates {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", m, 100000, nil)).Outcome)
	}
	l := startLoad(t, h, mandates, "fence")
	testWaitFor(t, func() bool {
		_, ok := groups.find(0, func(st sink.GroupStats) bool { return len(st.Committed) >= 2 })
		return ok
	}, "a group commit of several partitions")

	ctx := context.Background()
	rogue, err := sink.Open(ctx, sink.Config{DatabaseURL: h.DatabaseURL, MaxConns: 2, Instance: "rogue"}, zerolog.Nop())
	require.NoError(t, err)
	defer rogue.Close()
	const victim = int32(1)
	var mixed sink.GroupStats
	for attempt := 0; attempt < 10 && mixed.Parts == 0; attempt++ {
		from := groups.len()
		c, err := rogue.Claim(ctx, victim, "rogue")
		require.NoError(t, err)
		var fenced sink.GroupStats
		testWaitFor(t, func() bool {
			var ok bool
			fenced, ok = groups.find(from, func(st sink.GroupStats) bool { return st.Failed[victim] != nil })
			return ok
		}, "the victim's next part fenced")
		require.ErrorIs(t, fenced.Failed[victim], sink.ErrFenced)
		require.Len(t, fenced.Failed, 1, "only the claimed partition's part failed: %+v", fenced)
		require.NoError(t, fenced.Err)
		if len(fenced.Committed) > 0 {
			mixed = fenced
		}
		testWaitFor(t, func() bool { return a.Service.Processor.Owned()[victim] > c.Epoch }, "the victim re-claimed")
	}
	require.NotZero(t, mixed.Parts, "no fenced part shared its group commit with another partition's in 10 tries")
	require.NotContains(t, mixed.Committed, victim)
	t.Logf("group commit with a fenced part: %d parts, committed %v, failed %v", mixed.Parts, mixed.Committed, mixed.Failed)

	sent := l.finish()
	answers := answeredOnce(t, h, sent)
	for src, d := range answers {
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "%+v: %+v", src, d)
	}
	require.GreaterOrEqual(t, testutil.ToFloat64(a.Service.Metrics.Fenced), 1.0)
}

// A record the database refuses, in one partition's part of a group commit:
// that part rolls back to its savepoint, the other partitions' batches
// commit in the same transaction, and the partition isolates the record
// (its batch split through later group commits) so that only the poison
// record is rejected storage_refused and everything else is decided once.
func TestAPoisonRecordInAGroupCommitIsRejectedAloneAndTheOtherPartitionsCommit(t *testing.T) {
	t.Parallel()
	const n = 4
	var groups groupLog
	h := harness.New(t, harness.Options{Partitions: n, Timeout: 90 * time.Second})
	a := h.Start("a", groups.hook)
	mandates := homedMandates(n, "poison")
	for _, m := range mandates {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", m, 100000, nil)).Outcome)
	}
	// The database refuses any authorization whose idempotency key is
	// poisoned: a content error (check_violation), not a conflict.
	pool := openPool(t, h.DatabaseURL)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.idempotency_key LIKE 'poisoned-%' THEN
				RAISE EXCEPTION 'test: poisoned record' USING ERRCODE = 'check_violation';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_poison BEFORE INSERT ON authorizations FOR EACH ROW EXECUTE FUNCTION test_poison();`)
	require.NoError(t, err)

	l := startLoad(t, h, mandates, "fine")
	const victim = int32(2)
	var poisons []harness.Sent
	var mixed sink.GroupStats
	for attempt := 0; attempt < 10 && mixed.Parts == 0; attempt++ {
		from := groups.len()
		s := h.Send(propose("acme", mandates[victim], fmt.Sprintf("poisoned-%d", attempt), 100, nil))
		poisons = append(poisons, s)
		d := h.Await(s)
		require.Equal(t, wire.OutcomeRejected, d.Outcome, "%+v", d)
		require.Equal(t, wire.ReasonStorageRefused, d.Reason, "%+v", d)
		st, ok := groups.find(from, func(st sink.GroupStats) bool { return st.Failed[victim] != nil })
		require.True(t, ok, "the poisoned part failed in a group commit")
		require.ErrorIs(t, st.Failed[victim], sink.ErrRecordFault)
		require.Len(t, st.Failed, 1, "only the poisoned partition's part failed: %+v", st)
		require.NoError(t, st.Err)
		if len(st.Committed) > 0 {
			mixed = st
		}
	}
	require.NotZero(t, mixed.Parts, "no poisoned part shared its group commit with another partition's in 10 tries")
	t.Logf("group commit with a poisoned part: %d parts, committed %v", mixed.Parts, mixed.Committed)

	sent := l.finish()
	answers := answeredOnce(t, h, append(sent, poisons...))
	refused := 0
	for _, d := range answers {
		if d.Outcome == wire.OutcomeRejected {
			require.Equal(t, wire.ReasonStorageRefused, d.Reason)
			refused++
			continue
		}
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "%+v", d)
	}
	require.Equal(t, len(poisons), refused, "only the poisoned records are refused")
	require.Equal(t, float64(len(poisons)), testutil.ToFloat64(a.Service.Metrics.RecordFaults))
}

// Two processes, eight partitions, and rounds of eight goroutines that
// propose the same idempotency key at once to eight mandates, one on each
// partition: a key's scope is its mandate, so every mandate reserves one
// use for it. One in four of the first 64 authorizations of those keys the
// database sees is refused with a serialization failure (a trigger of the
// test's, after the part wrote its mandate's new counters): that part alone rolls
// back to its savepoint and its batch is decided again in a later group
// commit, so no use is ever spent twice.
func TestConcurrentProposalsAcrossPartitionsAndProcessesNeverSpendAUseTwice(t *testing.T) {
	t.Parallel()
	const n = 8
	var groups groupLog
	h := harness.New(t, harness.Options{Partitions: n, Timeout: 90 * time.Second})
	a := h.Start("a", groups.hook)
	b := h.Start("b", groups.hook)
	mandates := homedMandates(n, "race")
	for _, m := range mandates {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", m, 1000, nil)).Outcome)
	}
	testWaitFor(t, func() bool {
		oa, ob := len(a.Service.Processor.Owned()), len(b.Service.Processor.Owned())
		return oa > 0 && ob > 0 && oa+ob == n
	}, "both processes own partitions")
	pool := openPool(t, h.DatabaseURL)
	_, err := pool.Exec(context.Background(), `CREATE SEQUENCE test_conflicts;
		CREATE FUNCTION test_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE v bigint;
		BEGIN
			-- nextval is not rolled back with the part: one insert in four
			-- of the first 64 fails, and a retried row takes a new number.
			-- Not only the first few: a merged group's refused write runs
			-- the group again unmerged (sink/group.go), and the conflicts
			-- must reach some part of an unmerged group too.
			IF NEW.idempotency_key LIKE 'shared-%' THEN
				v := nextval('test_conflicts');
				IF v <= 64 AND v % 4 = 1 THEN
					RAISE EXCEPTION 'test: a conflict' USING ERRCODE = 'serialization_failure';
				END IF;
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_conflict BEFORE INSERT ON authorizations FOR EACH ROW EXECUTE FUNCTION test_conflict();`)
	require.NoError(t, err)

	var sent []harness.Sent
	keys := 0
	raced := func() bool {
		_, ok := groups.find(0, func(st sink.GroupStats) bool {
			for _, err := range st.Failed {
				if errors.Is(err, sink.ErrRetryable) {
					return true
				}
			}
			return false
		})
		return ok
	}
	for round := 0; round < 40 && !raced(); round++ {
		for range 4 {
			key := fmt.Sprintf("shared-%d", keys)
			keys++
			out := make([]harness.Sent, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, m := range mandates {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					out[i] = h.Send(propose("acme", m, key, 100, nil))
				}()
			}
			close(start)
			wg.Wait()
			sent = append(sent, out...)
		}
		answeredOnce(t, h, sent)
	}
	require.True(t, raced(), "no part of a group commit met the injected conflict in 40 rounds: the savepoint rollback was not exercised")
	t.Logf("%d keys proposed to %d mandates each before a part met the injected conflict", keys, n)

	answers := answeredOnce(t, h, sent)
	reserved := map[string][]string{} // key -> mandates that reserved it
	perMandate := map[string]int64{}
	for _, d := range answers {
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "%+v", d)
		reserved[d.IdempotencyKey] = append(reserved[d.IdempotencyKey], d.MandateID)
		perMandate[d.MandateID]++
	}
	require.Len(t, reserved, keys)
	for k, ms := range reserved {
		require.ElementsMatch(t, mandates, ms, "key %s reserved once on every mandate", k)
	}
	for _, m := range mandates {
		var held, spent int64
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT uses_held, uses_spent FROM mandates WHERE org = 'acme' AND mandate_id = $1`, m).
			Scan(&held, &spent))
		require.Equal(t, perMandate[m], held+spent, "mandate %s: stored uses match the reservations published", m)
	}
	var keysStored int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM authorizations WHERE idempotency_key LIKE 'shared-%'`).Scan(&keysStored))
	require.Equal(t, keys*n, keysStored, "one authorization per key and mandate")
}
