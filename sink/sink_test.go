package sink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

type testBundle struct {
	sink *sink.Sink
	url  string
}

func setup(t *testing.T, mods ...func(*sink.Config)) *testBundle {
	t.Helper()
	return setupN(t, 4, mods...)
}

// setupN is setup for topics of n partitions.
func setupN(t *testing.T, n int32, mods ...func(*sink.Config)) *testBundle {
	t.Helper()
	url := testdb.Migrated(t)
	cfg := sink.Config{DatabaseURL: url, TakeoverGrace: 500 * time.Millisecond, IdleInTxTimeout: 30 * time.Second}
	for _, m := range mods {
		m(&cfg)
	}
	s, err := sink.Open(context.Background(), cfg, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	require.NoError(t, s.EnsurePartitionCount(context.Background(), n))
	return &testBundle{sink: s, url: url}
}

// grantBatch decides one grant for key on its home partition.
func grantBatch(c sink.Claim, key partitioner.MandateKey, now time.Time) *sink.Batch {
	cmd := &wire.Command{Type: wire.CmdGrant, Key: key, Grant: &wire.Grant{
		Uses: 1, MaxAmount: wire.Money{MinorUnits: 100, Currency: "EUR"}, Operations: []string{"refund"},
		ReleaseOnCancel: true, HoldWindow: time.Minute, ExecutionTimeout: time.Hour}}
	needs := sink.NewNeeds()
	needs.Mandates[key] = struct{}{}
	from := sink.Position{ProposalsOffset: c.ProposalsOffset, GrantsOffset: c.GrantsOffset, NextSeq: c.NextSeq}
	return &sink.Batch{
		Partition: c.Partition, Epoch: c.Epoch, From: from,
		To:    sink.Position{ProposalsOffset: c.ProposalsOffset, GrantsOffset: c.GrantsOffset + 1},
		Needs: needs,
		Decide: func(st *lifecycle.State) ([]outboxrow.Row, error) {
			var rows []outboxrow.Row
			for _, d := range st.Decide(lifecycle.Input{Cmd: cmd, Source: wire.Source{Topic: "g", Partition: c.Partition, Offset: c.GrantsOffset}}, now) {
				b, err := d.Encode()
				if err != nil {
					return nil, err
				}
				rows = append(rows, outboxrow.Row{Partition: c.Partition, Seq: d.Sequence, Epoch: c.Epoch, Key: []byte(d.MandateKey), Payload: b, CreatedAt: now})
			}
			return rows, nil
		},
	}
}

func TestTheDatabaseMurmur2AgreesWithKafkasVectorsAndTheGoPartitioner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	vectors := map[string]int32{"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
		"a-little-bit-longer-string": -1486304829, "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107}
	for in, want := range vectors {
		var got int32
		require.NoError(t, b.sink.Pool().QueryRow(ctx, `SELECT mandated_murmur2(convert_to($1, 'UTF8'))`, in).Scan(&got))
		require.Equal(t, want, got, in)
	}
	for i := range 300 {
		key := fmt.Sprintf("org-%d/mandate-%d-é", i%7, i)
		var got int32
		require.NoError(t, b.sink.Pool().QueryRow(ctx, `SELECT mandated_home_partition($1, 64)`, key).Scan(&got))
		require.Equal(t, partitioner.ForKey([]byte(key), 64), got, key)
	}
}

func TestAStaleOwnerCannotCommitAfterATakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := partitioner.MandateKey{Org: "acme", MandateID: "m1"}
	p := key.Partition(4)
	first, err := b.sink.Claim(ctx, p, "first")
	require.NoError(t, err)
	second, err := b.sink.Claim(ctx, p, "second")
	require.NoError(t, err)
	require.Equal(t, first.Epoch+1, second.Epoch)

	_, err = b.sink.Commit(ctx, grantBatch(first, key, time.Now()))
	require.ErrorIs(t, err, sink.ErrFenced)
	_, err = b.sink.Inspect(ctx, key, 10)
	require.ErrorIs(t, err, sink.ErrNotFound, "nothing the stale owner decided is visible")

	_, err = b.sink.Commit(ctx, grantBatch(second, key, time.Now()))
	require.NoError(t, err)
}

func TestATakeoverTerminatesAPredecessorStuckInsideItsBatchAndFencesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := partitioner.MandateKey{Org: "acme", MandateID: "m2"}
	p := key.Partition(4)
	first, err := b.sink.Claim(ctx, p, "first")
	require.NoError(t, err)

	inBatch := make(chan struct{})
	release := make(chan struct{})
	batch := grantBatch(first, key, time.Now())
	batch.BeforeCommit = func(ctx context.Context) error {
		select {
		case inBatch <- struct{}{}:
		default:
		}
		<-release // paused inside the open transaction, holding the partition row
		return nil
	}
	done := make(chan error, 1)
	go func() { _, err := b.sink.Commit(ctx, batch); done <- err }()
	<-inBatch

	start := time.Now()
	second, err := b.sink.Claim(ctx, p, "second")
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, 1, second.Terminated, "the stuck predecessor's session was terminated")
	require.GreaterOrEqual(t, took, 500*time.Millisecond, "the claim waited the grace first")
	t.Logf("takeover of a partition held by a stuck batch took %s", took)
	close(release)
	err = <-done
	require.ErrorIs(t, err, sink.ErrFenced, "the woken predecessor finds itself fenced: %v", err)
	_, err = b.sink.Inspect(ctx, key, 10)
	require.ErrorIs(t, err, sink.ErrNotFound)
}

// inPartition runs statements in one transaction declared for partition p,
// as a batch does, and returns the first error.
func inPartition(ctx context.Context, b *testBundle, p int32, stmts ...func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, b.sink.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('mandated.partition', $1, true)`, fmt.Sprint(p)); err != nil {
			return err
		}
		for _, st := range stmts {
			if err := st(tx); err != nil {
				return err
			}
		}
		return nil
	})
}

func exec(ctx context.Context, sql string, args ...any) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
}

func TestTheDatabaseRefusesWritesOutsideAPartitionBatchOrAwayFromHome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := partitioner.MandateKey{Org: "acme", MandateID: "m3"}
	home := key.Partition(4)
	c, err := b.sink.Claim(ctx, home, "owner")
	require.NoError(t, err)
	_, err = b.sink.Commit(ctx, grantBatch(c, key, time.Now()))
	require.NoError(t, err)

	pool := b.sink.Pool()
	_, err = pool.Exec(ctx, `UPDATE mandates SET uses_allowed = 5 WHERE org = 'acme'`)
	require.ErrorContains(t, err, "outside a partition batch")

	other := (home + 1) % 4
	err = inPartition(ctx, b, other, exec(ctx, `UPDATE mandates SET uses_allowed = 5 WHERE org = 'acme'`))
	require.ErrorContains(t, err, "may not write")

	// A mandate id whose home is not `other`, inserted from `other`.
	misrouted := "m3-misrouted-0"
	for i := 1; partitioner.ForKey([]byte("acme/"+misrouted), 4) == other; i++ {
		misrouted = fmt.Sprint("m3-misrouted-", i)
	}
	err = inPartition(ctx, b, other, exec(ctx, `INSERT INTO mandates (org, mandate_id, partition, version, status, operations,
		targets, currency, max_amount, uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent,
		release_on_cancel, hold_window_ms, execution_timeout_ms, created_at, updated_at)
		VALUES ('acme', $2, $1, 1, 'active', '{refund}', '{}', 'EUR', 1, 1, 0, 0, 0, 0, 0, true, 1, 1, now(), now())`, other, misrouted))
	require.ErrorContains(t, err, "is not at home")

	err = inPartition(ctx, b, home, exec(ctx, `UPDATE mandates SET uses_held = 2 WHERE org = 'acme' AND mandate_id = 'm3'`))
	require.ErrorContains(t, err, "mandate_uses_within_grant", "held + spent can never exceed the grant")
}

func TestATerminalAuthorizationNeverChanges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := partitioner.MandateKey{Org: "acme", MandateID: "m4"}
	home := key.Partition(4)
	c, err := b.sink.Claim(ctx, home, "owner")
	require.NoError(t, err)
	_, err = b.sink.Commit(ctx, grantBatch(c, key, time.Now()))
	require.NoError(t, err)
	err = inPartition(ctx, b, home,
		exec(ctx, `INSERT INTO authorizations (org, mandate_id, authorization_id, partition, state, version,
			operation, target, amount, currency, idempotency_key, mandate_version, deadline, external_ref, decision_id, created_at, updated_at)
			VALUES ('acme', 'm4', 'au_x', $1, 'committed', 1, 'refund', 't', 10, 'EUR', 'k', 1, now(), 'ref', '1-1', now(), now())`, home),
		exec(ctx, `UPDATE authorizations SET state = 'cancelled' WHERE authorization_id = 'au_x'`))
	require.ErrorContains(t, err, "terminal")
	var pgErr interface{ SQLState() string }
	require.True(t, errors.As(err, &pgErr))
}

func TestAnExecutionTokenAndItsExecutorNeverChangeAndTheCounterNeverGoesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := partitioner.MandateKey{Org: "acme", MandateID: "m5"}
	home := key.Partition(4)
	c, err := b.sink.Claim(ctx, home, "owner")
	require.NoError(t, err)
	_, err = b.sink.Commit(ctx, grantBatch(c, key, time.Now()))
	require.NoError(t, err)
	insert := exec(ctx, `INSERT INTO authorizations (org, mandate_id, authorization_id, partition, state, version,
		operation, target, amount, currency, idempotency_key, mandate_version, deadline, execution_deadline, begin_key,
		execution_token, decision_id, created_at, updated_at)
		VALUES ('acme', 'm5', 'au_e', $1, 'executing', 2, 'refund', 't', 10, 'EUR', 'k', 1, now(), now(), 'winner', 7, '1-1', now(), now())`, home)
	for _, tc := range []struct {
		name string
		sql  []string
		err  string
	}{
		{"another token", []string{`UPDATE authorizations SET execution_token = 8 WHERE authorization_id = 'au_e'`}, "cannot change"},
		{"another executor", []string{`UPDATE authorizations SET begin_key = 'loser' WHERE authorization_id = 'au_e'`}, "cannot change"},
		{"a counter going back", []string{`UPDATE mandates SET executions = executions + 3 WHERE mandate_id = 'm5'`,
			`UPDATE mandates SET executions = 1 WHERE mandate_id = 'm5'`}, "cannot go back"},
		{"a terms version going back", []string{`UPDATE mandates SET version = version + 2, terms_version = version + 2 WHERE mandate_id = 'm5'`,
			`UPDATE mandates SET terms_version = 1 WHERE mandate_id = 'm5'`}, "terms version of acme/m5 cannot go back"},
		{"a result on an executing authorization", []string{`UPDATE authorizations SET result = '{}' WHERE authorization_id = 'au_e'`}, "result_only_when_committed"},
	} {
		stmts := []func(pgx.Tx) error{insert}
		for _, q := range tc.sql {
			stmts = append(stmts, exec(ctx, q))
		}
		err := inPartition(ctx, b, home, stmts...)
		require.ErrorContains(t, err, tc.err, tc.name)
	}
	// The guarded columns still move together with the state otherwise.
	require.NoError(t, inPartition(ctx, b, home, insert,
		exec(ctx, `UPDATE authorizations SET state = 'committed', external_ref = 'r', result = '{"ok":true}' WHERE authorization_id = 'au_e'`)))
}

func storedHead(t *testing.T, conn *pgx.Conn, p int32) (wire.ChainHash, int64) {
	t.Helper()
	var head []byte
	var after int64
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT p.head_hash, a.after_seq FROM mandated_partitions p
		JOIN chain_anchors a USING (partition) WHERE partition = $1`, p).Scan(&head, &after))
	var h wire.ChainHash
	copy(h[:], head)
	return h, after
}

// The writer chains each batch onto the head stored with the fence, so a
// takeover (a new epoch) continues the chain the previous owner left.
func TestEachBatchContinuesTheChainFromTheHeadStoredWithTheFenceAcrossATakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	key := partitioner.MandateKey{Org: "acme", MandateID: "chain-1"}
	p := key.Partition(4)
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

	c1, err := b.sink.Claim(ctx, p, "first")
	require.NoError(t, err)
	require.Equal(t, wire.Anchor(p, 0).String(), fmt.Sprintf("%x", c1.Head), "a first claim starts at the anchor")
	r1, err := b.sink.Commit(ctx, grantBatch(c1, key, now))
	require.NoError(t, err)
	require.Len(t, r1.Rows, 1)
	require.Equal(t, wire.Anchor(p, 0), r1.Rows[0].PrevHash)
	l, err := wire.DecisionLink(r1.Rows[0].Payload)
	require.NoError(t, err)
	require.True(t, l.Intact())
	require.Equal(t, r1.Rows[0].Hash, l.Claimed)
	head, after := storedHead(t, conn, p)
	require.Equal(t, r1.Rows[0].Hash, head)
	require.Zero(t, after)

	c2, err := b.sink.Claim(ctx, p, "second")
	require.NoError(t, err)
	require.Greater(t, c2.Epoch, c1.Epoch)
	require.Equal(t, fmt.Sprintf("%x", r1.Rows[0].Hash[:]), fmt.Sprintf("%x", c2.Head))
	key2 := partitioner.MandateKey{Org: "acme", MandateID: "chain-1"}
	r2, err := b.sink.Commit(ctx, grantBatch(c2, key2, now.Add(time.Second)))
	require.NoError(t, err)
	require.Equal(t, r1.Rows[0].Hash, r2.Rows[0].PrevHash, "the new epoch continues the chain")
	head, _ = storedHead(t, conn, p)
	require.Equal(t, r2.Rows[0].Hash, head)

	// The outbox row keeps exactly the bytes and hashes the relay publishes.
	var payload, prev, hash []byte
	require.NoError(t, conn.QueryRow(ctx, `SELECT payload, prev_hash, hash FROM outbox WHERE partition = $1 AND seq = $2`,
		p, r2.Rows[0].Seq).Scan(&payload, &prev, &hash))
	require.Equal(t, r2.Rows[0].Payload, payload)
	require.Equal(t, r2.Rows[0].PrevHash[:], prev)
	require.Equal(t, r2.Rows[0].Hash[:], hash)
}

// Migration 0008 anchors each partition that already has decisions after
// its last sequence; the database computes anchors as wire.Anchor does.
func TestMigration0008AnchorsExistingPartitionsAfterTheirLastSequence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.Database(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	ms, err := sink.Migrations()
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE mandated_schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	for _, m := range ms {
		if m.Version >= 8 {
			break
		}
		_, err := conn.Exec(ctx, m.SQL)
		require.NoError(t, err, m.Name)
		_, err = conn.Exec(ctx, `INSERT INTO mandated_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		require.NoError(t, err)
	}
	_, err = conn.Exec(ctx, `INSERT INTO mandated_partitions (partition, epoch, owner, next_seq) VALUES (0, 3, 'old', 42), (1, 1, 'old', 1)`)
	require.NoError(t, err)

	applied, err := sink.Migrate(ctx, conn)
	require.NoError(t, err)
	require.Contains(t, applied, 8)
	head, after := storedHead(t, conn, 0)
	require.Equal(t, int64(41), after)
	require.Equal(t, wire.Anchor(0, 41), head)
	head, after = storedHead(t, conn, 1)
	require.Zero(t, after)
	require.Equal(t, wire.Anchor(1, 0), head)
	_, err = conn.Exec(ctx, `INSERT INTO mandated_partitions (partition, epoch, owner) VALUES (7, 1, 'new')`)
	require.NoError(t, err)
	head, after = storedHead(t, conn, 7)
	require.Zero(t, after)
	require.Equal(t, wire.Anchor(7, 0), head)
	for _, v := range []struct {
		p     int32
		after int64
	}{{0, 0}, {11, 123456789}, {2147483647, 9223372036854775806}} {
		var sum []byte
		require.NoError(t, conn.QueryRow(ctx, `SELECT mandated_chain_anchor($1, $2)`, v.p, v.after).Scan(&sum))
		want := wire.Anchor(v.p, v.after)
		require.Equal(t, want[:], sum)
	}
}

// A batch sends its writes and its COMMIT in one round trip, so a write
// that finds its row taken must abort the transaction in the database,
// before the COMMIT behind it: the test plays another writer that binds
// the batch's idempotency key (the same scope, another fingerprint)
// between the batch's load and its writes. The batch must decide again,
// see the binding, and answer conflict — with nothing of its first attempt
// (a reservation, a use held, a decision) stored.
func TestAKeyTakenBetweenTheLoadAndTheWritesMakesTheBatchDecideAgainWithNothingOfTheFirstAttemptStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := partitioner.MandateKey{Org: "acme", MandateID: "taken"}
	p := key.Partition(4)
	c, err := b.sink.Claim(ctx, p, "owner")
	require.NoError(t, err)
	now := time.Now()
	res, err := b.sink.Commit(ctx, grantBatch(c, key, now))
	require.NoError(t, err)

	cmd := &wire.Command{Type: wire.CmdPropose, Key: key, IdempotencyKey: "k-taken",
		Propose: &wire.Propose{Operation: "refund", Amount: wire.Money{MinorUnits: 10, Currency: "EUR"}, Target: "t"}}
	scope, _ := lifecycle.ScopeOf(cmd)
	needs := sink.NewNeeds()
	needs.Mandates[key] = struct{}{}
	needs.Idem[scope] = struct{}{}
	attempts := 0
	batch := &sink.Batch{
		Partition: p, Epoch: c.Epoch, From: res.Position, Needs: needs,
		To: sink.Position{ProposalsOffset: res.Position.ProposalsOffset + 1, GrantsOffset: res.Position.GrantsOffset},
		Decide: func(st *lifecycle.State) ([]outboxrow.Row, error) {
			attempts++
			if attempts == 1 {
				// The other writer, after the load.
				_, err := b.sink.Pool().Exec(ctx, `INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint,
					mandate_id, partition, decision_id, outcome, created_at, expires_at)
					VALUES ($1, $2, $3, decode(repeat('ee', 32), 'hex'), $4, $5, 'elsewhere', 'reserved', now(), now() + interval '1 day')`,
					scope.Org, scope.Operation, scope.Key, key.MandateID, p)
				if err != nil {
					return nil, err
				}
			}
			var rows []outboxrow.Row
			for _, d := range st.Decide(lifecycle.Input{Cmd: cmd, Source: wire.Source{Topic: "p", Partition: p, Offset: res.Position.ProposalsOffset}}, now) {
				enc, err := d.Encode()
				if err != nil {
					return nil, err
				}
				rows = append(rows, outboxrow.Row{Partition: p, Seq: d.Sequence, Epoch: c.Epoch, Key: []byte(d.MandateKey), Payload: enc, CreatedAt: now})
			}
			return rows, nil
		},
	}
	res2, err := b.sink.Commit(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, 2, res2.Attempts, "the first attempt's writes were refused and the batch decided again")
	require.Equal(t, []string{"version"}, res2.Retries)
	require.Len(t, res2.Rows, 1)
	require.Contains(t, string(res2.Rows[0].Payload), `"outcome":"conflict"`)

	var held, auths, outboxRows int64
	require.NoError(t, b.sink.Pool().QueryRow(ctx, `SELECT uses_held FROM mandates WHERE org = $1 AND mandate_id = $2`, key.Org, key.MandateID).Scan(&held))
	require.NoError(t, b.sink.Pool().QueryRow(ctx, `SELECT count(*) FROM authorizations WHERE org = $1 AND mandate_id = $2`, key.Org, key.MandateID).Scan(&auths))
	require.NoError(t, b.sink.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE partition = $1`, p).Scan(&outboxRows))
	require.Zero(t, held, "no use is held by the first attempt's reservation")
	require.Zero(t, auths, "the first attempt's authorization is not stored")
	require.EqualValues(t, 2, outboxRows, "the grant's decision and the conflict, nothing else")
}
