package processor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/wire"
)

// twoMandatesOnTwoShards returns two mandates of org acme whose home
// partitions (of 4) lie on shard a (0-1) and on shard b (2-3).
func twoMandatesOnTwoShards() (onA, onB string) {
	for i := 0; onA == "" || onB == ""; i++ {
		id := fmt.Sprintf("m-%d", i)
		if p := (partitioner.MandateKey{Org: "acme", MandateID: id}).Partition(4); p <= 1 && onA == "" {
			onA = id
		} else if p >= 2 && onB == "" {
			onB = id
		}
	}
	return onA, onB
}

// scopeAnswer is what a caller learns from a decision, comparable across
// deployments (ids and sequences differ, what was decided must not).
type scopeAnswer struct {
	Outcome wire.Outcome
	Reason  wire.Reason
	// Names says which of the test's reservations the decision names
	// ("m1/k": the one mandate m1 made for key k), "none" when it names
	// no authorization.
	Names string
}

// TestTheSameKeyAndIntentOnTwoMandatesAreAnsweredAlikeOnOneDatabaseAndOnTwoShards
// proposes the same idempotency key, and separately the same intent, on
// two mandates whose partitions live on different shards of a shard map,
// and the same proposals against one database. The scope of a key and of
// an intent is the mandate, so both deployments give every step the same
// answer: two independent reservations, each replayed on retry; and
// within one mandate a key with another payload is still a conflict, and
// the intent under a regenerated key still its replay.
func TestTheSameKeyAndIntentOnTwoMandatesAreAnsweredAlikeOnOneDatabaseAndOnTwoShards(t *testing.T) {
	t.Parallel()
	m1, m2 := twoMandatesOnTwoShards()
	intent := withIntent("run-7", "refund", "refund:customer-991", "")
	steps := []struct {
		name  string
		cmd   map[string]any
		binds string // the reservation this step makes, named for later steps
	}{
		{"m1 reserves key k", propose("acme", m1, "k", 100, nil), "m1/k"},
		{"m2 reserves the same key k", propose("acme", m2, "k", 100, nil), "m2/k"},
		{"m1 reserves intent I under key i-1", propose("acme", m1, "i-1", 100, intent), "m1/I"},
		{"m2 reserves the same intent I under key i-2", propose("acme", m2, "i-2", 100, intent), "m2/I"},
		{"m2 retries key k: its own reservation", propose("acme", m2, "k", 100, nil), ""},
		{"m2 retries intent I under a new key: its own reservation", propose("acme", m2, "i-3", 100, intent), ""},
		{"m1 retries key k: its own reservation", propose("acme", m1, "k", 100, nil), ""},
		{"m1 sends key k with another amount: a conflict", propose("acme", m1, "k", 200, nil), ""},
		{"m1 sends intent I under a new key: its replay", propose("acme", m1, "i-4", 100, intent), ""},
	}
	run := func(t *testing.T, h *harness.Harness) []scopeAnswer {
		for _, m := range []string{m1, m2} {
			require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", m, 5, nil)).Outcome)
		}
		reserved := map[string]string{}
		var out []scopeAnswer
		for _, s := range steps {
			d := h.SendAwait(s.cmd)
			if s.binds != "" && d.Outcome == wire.OutcomeReserved {
				reserved[s.binds] = d.AuthorizationID
			}
			a := scopeAnswer{Outcome: d.Outcome, Reason: d.Reason, Names: "none"}
			if d.AuthorizationID != "" {
				a.Names = "an authorization the test did not reserve"
				for name, id := range reserved {
					if id == d.AuthorizationID {
						a.Names = name
					}
				}
			}
			t.Logf("%s: %s %s (%s)", s.name, d.Outcome, d.Reason, a.Names)
			out = append(out, a)
		}
		return out
	}

	one := harness.New(t, harness.Options{Partitions: 4})
	one.Start("one-database")
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-3, url: %q}]}`, urlA, urlB))
	require.NoError(t, err)
	two := harness.New(t, harness.Options{Partitions: 4, Configure: func(c *processor.ServiceConfig) { c.Shards = m }})
	two.Start("two-shards")

	onOne := run(t, one)
	onTwo := run(t, two)
	for i, s := range steps {
		require.Equal(t, onOne[i], onTwo[i], "step %q is answered alike on one database and on two shards", s.name)
	}
	want := []scopeAnswer{
		{wire.OutcomeReserved, "", "m1/k"},
		{wire.OutcomeReserved, "", "m2/k"},
		{wire.OutcomeReserved, "", "m1/I"},
		{wire.OutcomeReserved, "", "m2/I"},
		{wire.OutcomeReplayed, "", "m2/k"},
		{wire.OutcomeReplayed, wire.ReasonIntentReplayed, "m2/I"},
		{wire.OutcomeReplayed, "", "m1/k"},
		{wire.OutcomeConflict, wire.ReasonIdempotencyConflict, "m1/k"},
		{wire.OutcomeReplayed, wire.ReasonIntentReplayed, "m1/I"},
	}
	for i, s := range steps {
		require.Equal(t, want[i], onOne[i], "step %q", s.name)
	}
}

// TestAConsolidationOfTwoShardsThatBoundTheSameKeyOnTwoMandatesMovesAndReplaysBoth:
// shard a and shard b each bound the key k and the intent I, on mandates of
// their own partitions. Moving shard a's partitions to shard b (the
// consolidation a repartition needs) is never refused for it: the keys and
// intents of two mandates never collide. Afterwards the processor, reading
// the rewritten map, answers both mandates' retries from shard b with
// their own reservations.
func TestAConsolidationOfTwoShardsThatBoundTheSameKeyOnTwoMandatesMovesAndReplaysBoth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m1, m2 := twoMandatesOnTwoShards()
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	mapPath := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(mapPath, fmt.Appendf(nil,
		"shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB), 0o644))
	m, err := shardmap.Read(mapPath)
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 4, Configure: func(c *processor.ServiceConfig) { c.Shards = m }})
	h.Start("solo")
	intent := withIntent("run-7", "refund", "refund:customer-991", "")
	first := map[string]wire.Decision{}
	for _, id := range []string{m1, m2} {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", id, 5, nil)).Outcome)
		for _, c := range []struct {
			what string
			cmd  map[string]any
		}{{"k", propose("acme", id, "k", 100, nil)}, {"I", propose("acme", id, "i-"+id, 100, intent)}} {
			d := h.SendAwait(c.cmd)
			require.Equal(t, wire.OutcomeReserved, d.Outcome, "%s on %s: %+v", c.what, id, d)
			first[id+"/"+c.what] = d
		}
	}

	for _, p := range []int32{0, 1} {
		moveAndMap(t, ctx, mapPath, p, urlA, urlB, "b")
	}
	var keys, intents int
	pool := openPool(t, urlB)
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k'),
		(SELECT count(*) FROM intents WHERE run_id = 'run-7')`).Scan(&keys, &intents))
	require.Equal(t, 2, keys, "shard b holds both mandates' bindings of k")
	require.Equal(t, 2, intents, "and of the intent")

	for _, id := range []string{m1, m2} {
		d := h.SendAwait(propose("acme", id, "k", 100, nil))
		require.Equal(t, wire.OutcomeReplayed, d.Outcome, "%s: %+v", id, d)
		require.Equal(t, first[id+"/k"].AuthorizationID, d.AuthorizationID)
		d = h.SendAwait(propose("acme", id, "i-again-"+id, 100, intent))
		require.Equal(t, wire.ReasonIntentReplayed, d.Reason, "%s: %+v", id, d)
		require.Equal(t, first[id+"/I"].AuthorizationID, d.AuthorizationID)
	}
}
