package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/testenv"
)

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []planNode `json:"Plans"`
}

func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// The batch loads run with generic plans (lockPartitionSQL), made at a
// statement's first executions on a connection and kept. On a new
// database the tables have no statistics and look small, so a generic plan
// made then must not be one that reads a whole table: that is what
// loadIdemSQL's was (a hash join over a sequential scan of
// idempotency_keys), and every batch of every connection read every key
// stored so far, until an ANALYZE invalidated the plan. The test plays a
// new deployment: a migrated, empty database, the loads prepared with
// generic plans, then the tables filled; every table a load reads must be
// read through an index of the key it names (the primary key for a lookup
// of one row).
func TestTheBatchLoadsGenericPlansLookEachKeyUpByIndexOnANewDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.Database(t)
	s, err := Open(ctx, Config{DatabaseURL: url}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)

	texts := func(n int) string { return strings.TrimSuffix(strings.Repeat(`'{x,y,z}',`, n), ",") }
	loads := []struct {
		name, sql, args string
		// lookups: the tables a load reads by key, which must be read
		// through an index.
		lookups []string
	}{
		{"loadMandatesSQL", loadMandatesSQL, texts(2), []string{"mandates"}},
		{"loadIdemSQL", loadIdemSQL, texts(4), []string{"idempotency_keys"}},
		{"loadIntentsSQL", loadIntentsSQL, texts(6), []string{"intents"}},
		{"loadAuthsSQL", loadAuthsSQL, texts(17), []string{"authorizations", "mandates", "idempotency_keys", "intents"}},
		{"loadRecentSQL", loadRecentSQL, texts(2) + `, '{2026-01-01T00:00:00Z,2026-01-01T00:00:00Z,2026-01-01T00:00:00Z}'`,
			[]string{"authorizations"}},
	}
	explain := func(name, args string) planNode {
		var js []byte
		require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf(`EXPLAIN (FORMAT JSON) EXECUTE %s(%s)`, name, args)).Scan(&js))
		var out []struct {
			Plan planNode `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal(js, &out))
		return out[0].Plan
	}
	for _, l := range loads {
		_, err := conn.Exec(ctx, fmt.Sprintf(`PREPARE %s AS %s`, l.name, l.sql))
		require.NoError(t, err, l.name)
		explain(l.name, l.args) // the generic plan is made now, on empty tables
	}

	// The tables fill (from another session, without the guard triggers);
	// the plans stay.
	fill, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { fill.Close(context.Background()) })
	_, err = fill.Exec(ctx, `SET session_replication_role = replica`)
	require.NoError(t, err)
	for _, q := range []string{
		`INSERT INTO mandates (org, mandate_id, partition, version, status, operations, targets, currency, max_amount,
		  uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, release_on_cancel, hold_window_ms,
		  execution_timeout_ms, last_authorization_id, created_at, updated_at)
		 SELECT 'acme', 'm-' || g, 0, 1, 'active', '{refund}', '{}', 'EUR', 100, 1000000, 0, 0, 0, 0, 0, true, 60000, 60000,
		  'au-' || g, now(), now() FROM generate_series(1, 2000) g`,
		`INSERT INTO authorizations (org, mandate_id, authorization_id, partition, state, version, operation, target, amount,
		  currency, idempotency_key, mandate_version, deadline, decision_id, created_at, updated_at, external_ref)
		 SELECT 'acme', 'm-' || (g % 2000 + 1), 'au-' || g, 0, 'committed', 1, 'refund', 't', 1, 'EUR', 'k-' || g, 1,
		  now(), 'd', now(), now(), 'r' FROM generate_series(1, 20000) g`,
		`INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint, mandate_id, partition, authorization_id,
		  decision_id, outcome, created_at, expires_at)
		 SELECT 'acme', 'refund', 'k-' || g, decode(repeat('ab', 32), 'hex'), 'm-' || (g % 2000 + 1), 0, 'au-' || g, 'd',
		  'reserved', now(), now() + interval '1 day' FROM generate_series(1, 20000) g`,
	} {
		_, err := fill.Exec(ctx, q)
		require.NoError(t, err)
	}

	for _, l := range loads {
		plan := explain(l.name, l.args)
		indexed := map[string]bool{}
		plan.walk(func(n planNode) {
			switch n.Type {
			case "Seq Scan":
				t.Errorf("%s: its generic plan reads the whole of %s (a sequential scan)", l.name, n.Relation)
			case "Index Scan", "Index Only Scan":
				indexed[n.Relation] = true
			case "Hash Join", "Merge Join":
				t.Errorf("%s: its generic plan has a %s, which reads one side whole", l.name, n.Type)
			}
			if n.Index == "authorizations_recent" && l.name == "loadAuthsSQL" {
				t.Errorf("%s: looks authorizations up by key through authorizations_recent, reading each mandate's all", l.name)
			}
		})
		for _, table := range l.lookups {
			if !indexed[table] {
				t.Errorf("%s: does not look %s up through an index", l.name, table)
			}
		}
	}
}
