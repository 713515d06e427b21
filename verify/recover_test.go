package verify_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// forger is someone holding mandated's Kafka credential: a plain producer
// that writes in transactions, as the relay does.
func forger(t *testing.T, h *harness.Harness) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID(testenv.Name(t, "forger")), kgo.TransactionTimeout(time.Minute)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// continueChain writes, in a committed transaction, the decision after
// head on its partition: a copy of head's with the sequence, the decision
// id and the mandate's version moved on, changed by mutate, hashed onto
// head and with the headers the relay writes (sequence, epoch).
func continueChain(t *testing.T, cl *kgo.Client, topic string, head harness.Record, mutate func(*wire.Decision)) int64 {
	t.Helper()
	return continueChainSigned(t, cl, topic, head, nil, mutate)
}

// continueChainSigned is continueChain, the record signed by signer (nil:
// unsigned), as someone holding mandated's decision key as well would.
func continueChainSigned(t *testing.T, cl *kgo.Client, topic string, head harness.Record, signer *wire.RecordSigner, mutate func(*wire.Decision)) int64 {
	t.Helper()
	f := *head.Decision
	f.Sequence++
	f.DecisionID = wire.DecisionID(f.Partition, f.Sequence)
	f.Binds = nil
	if f.Mandate != nil {
		m := *f.Mandate
		m.Version++
		m.UsesAllowed = 1000
		f.Mandate = &m
	}
	mutate(&f)
	f.PrevHash, f.Hash = "", ""
	enc, err := f.Encode()
	require.NoError(t, err)
	prev, err := wire.ParseChainHash(head.Decision.Hash)
	require.NoError(t, err)
	sealed, hash := wire.Seal(enc, prev)
	r := &kgo.Record{Topic: topic, Partition: f.Partition, Key: []byte(f.MandateKey), Value: sealed,
		Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(fmt.Sprint(f.Sequence))},
			{Key: wire.HeaderEpoch, Value: []byte(fmt.Sprint(f.Epoch))}}}
	if signer != nil {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: wire.HeaderSignature, Value: signer.SignRecord(hash)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.BeginTransaction())
	require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	require.NoError(t, cl.EndTransaction(ctx, kgo.TryCommit))
	return r.Offset
}

// lastOn is the last decision published on partition p.
func lastOn(h *harness.Harness, p int32) harness.Record {
	var last harness.Record
	for _, r := range h.Decisions.Records() {
		if r.Partition == p && r.Decision != nil {
			last = r
		}
	}
	return last
}

type partitionRow struct {
	nextSeq, proposals, grants int64
}

func (b *testBundle) partitionRow(t *testing.T, p int32) partitionRow {
	t.Helper()
	var r partitionRow
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT next_seq, proposals_offset, grants_offset FROM mandated_partitions WHERE partition = $1`, p).
		Scan(&r.nextSeq, &r.proposals, &r.grants))
	return r
}

func (b *testBundle) recover(t *testing.T, mods ...func(*verify.RecoverConfig)) (map[int32]verify.PartitionRecovery, error) {
	t.Helper()
	cfg := verify.RecoverConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(b.h.Brokers...)}, b.h.KafkaOpts...), Pool: b.pool,
		DecisionsTopic: b.h.Spec.Decisions, DeadLetterTopic: b.h.Spec.DeadLetter, ProposalsTopic: b.h.Spec.Proposals, GrantsTopic: b.h.Spec.Grants}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := verify.Recover(ctx, cfg)
	out := map[int32]verify.PartitionRecovery{}
	for _, r := range res {
		out[r.Partition] = r
	}
	return out, err
}

// Someone holding mandated's Kafka credential continues a partition's
// chain past PostgreSQL's head — well formed, hashed onto the head, in a
// transaction, with the relay's headers — so mandated refuses the
// partition (fail closed) and an operator runs recover. Each forgery
// answers an input it cannot: an offset past the proposals partition's
// last stable offset (2^62: every later input would be "already
// decided"), a real proposal it calls a grant, a real unsigned grant it
// calls signed. recover, dry run or not, refuses each, says why, and
// writes nothing: PostgreSQL's head and input offsets stay where they
// were. The untouched partition is in step.
func TestRecoverRefusesAChainContinuationThatAnswersNoInputItNames(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	a := b.h.Start("a")
	mandates := map[int32]string{}
	for p := range int32(4) {
		mandates[p] = mandateOn(p, 4, fmt.Sprintf("m%d-", p))
		require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", mandates[p], 1, nil)).Outcome)
	}
	b.h.Stop(a)
	// Inputs no processor decided yet.
	proposal := b.h.Send(propose("acme", mandates[1], "k1", 100))
	unsigned := b.h.Send(grant("acme", mandates[2], 5, nil))
	require.Equal(t, int32(1), proposal.Partition)
	require.Equal(t, int32(2), unsigned.Partition)

	cl := forger(t, b.h)
	before := map[int32]partitionRow{}
	for p := range int32(3) {
		before[p] = b.partitionRow(t, p)
	}
	// Signed with mandated's own key (stolen too): only re-deciding the
	// inputs can refuse them.
	key := b.h.Signer
	continueChainSigned(t, cl, b.h.Spec.Decisions, lastOn(b.h, 0), key, func(d *wire.Decision) {
		d.Source = &wire.Source{Topic: b.h.Spec.Proposals, Partition: 0, Offset: 1 << 62}
	})
	continueChainSigned(t, cl, b.h.Spec.Decisions, lastOn(b.h, 1), key, func(d *wire.Decision) {
		d.Source = &wire.Source{Topic: b.h.Spec.Proposals, Partition: 1, Offset: proposal.Offset}
	})
	continueChainSigned(t, cl, b.h.Spec.Decisions, lastOn(b.h, 2), key, func(d *wire.Decision) {
		d.Source = &wire.Source{Topic: b.h.Spec.Grants, Partition: 2, Offset: unsigned.Offset}
		d.SignedBy = "forged-key"
	})

	want := map[int32]string{
		0: "at or past the last stable offset",
		1: "gives another decision: reserved (no reason), the record says granted",
		2: "signed_by",
	}
	for _, dry := range []bool{true, false} {
		start := time.Now()
		res, err := b.recover(t, func(c *verify.RecoverConfig) { c.DryRun = dry })
		t.Logf("dry run %v: %.2fs", dry, time.Since(start).Seconds())
		require.Error(t, err, "dry run %v", dry)
		for p, why := range want {
			r := res[p]
			require.Equal(t, verify.RecoveryRefused, r.State, "dry run %v, partition %d: %+v", dry, p, r)
			require.Len(t, r.Foreign, 1, "dry run %v, partition %d: %+v", dry, p, r)
			require.Contains(t, r.Foreign[0].Why, why, "dry run %v, partition %d", dry, p)
			require.Contains(t, err.Error(), fmt.Sprintf("partition %d", p))
			require.Equal(t, before[p], b.partitionRow(t, p), "dry run %v: partition %d's row is unchanged", dry, p)
		}
		require.Equal(t, verify.RecoveryInStep, res[3].State)
	}
}

// A producer holding a transaction open on a partition's decisions topic
// keeps its last stable offset down: recover waits for it only as long
// as it is told, then says which producer holds it and since which
// offset, and writes nothing.
func TestRecoverBoundsTheWaitForATransactionHeldOpenAndNamesItsProducer(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
	b.h.Stop(a)
	cl := forger(t, b.h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.BeginTransaction())
	r := &kgo.Record{Topic: b.h.Spec.Decisions, Partition: 0, Key: []byte("acme/m"), Value: []byte(`{"held":"open"}`)}
	require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	t.Cleanup(func() { _ = cl.EndTransaction(context.Background(), kgo.TryAbort) })
	before := b.partitionRow(t, 0)

	start := time.Now()
	_, err := b.recover(t, func(c *verify.RecoverConfig) { c.SettleTimeout = 2 * time.Second })
	took := time.Since(start)
	t.Logf("refused after %.2fs: %v", took.Seconds(), err)
	require.ErrorIs(t, err, outbox.ErrOpenTransaction)
	require.Less(t, took, 10*time.Second)
	require.Contains(t, err.Error(), fmt.Sprintf("producer id %d", r.ProducerID))
	require.Contains(t, err.Error(), fmt.Sprintf("since offset %d", r.Offset))
	require.Equal(t, before, b.partitionRow(t, 0))
}

// A producer appends a flood of records after mandated's last one on a
// partition: recover reads back no more than it is told, says so and who
// wrote them, and writes nothing.
func TestRecoverBoundsTheReadBackOfAFloodOfForeignRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
	b.h.Stop(a)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, b.h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const flood = 3000
	recs := make([]*kgo.Record, flood)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: b.h.Spec.Decisions, Partition: 0, Key: []byte("acme/m"), Value: []byte(`{"flood":true}`),
			Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(fmt.Sprint(100 + i))}}}
	}
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	before := b.partitionRow(t, 0)

	start := time.Now()
	res, err := b.recover(t, func(c *verify.RecoverConfig) { c.MaxRead = 1000 })
	t.Logf("refused after %.2fs: %v", time.Since(start).Seconds(), err)
	require.Error(t, err, "%+v", res)
	require.True(t, errors.Is(err, outbox.ErrTailTooLong), "%v", err)
	require.Contains(t, err.Error(), fmt.Sprintf("producer %d", recs[0].ProducerID))
	require.True(t, strings.Contains(err.Error(), "1000"), "%v", err)
	require.Equal(t, before, b.partitionRow(t, 0))
}

// copyDatabase copies the harness's database (nobody connected: the
// instances stopped) as a backup taken now would restore it; the copy is
// dropped at cleanup.
func copyDatabase(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	admin := strings.Replace(url, "/"+src.Database+"?", "/postgres?", 1)
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	name := src.Database + "_bk"
	testenv.WaitFor(t, 30*time.Second, func() bool {
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{src.Database}.Sanitize()))
		return err == nil
	}, "copy the database (nobody connected)")
	pool, err := pgxpool.New(ctx, strings.Replace(url, "/"+src.Database+"?", "/"+name+"?", 1))
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	return pool
}

// A database restored from a backup lost two decisions the topic holds,
// and someone holding mandated's Kafka credential continued the chain
// after them. recover believes the two lost decisions and rebuilds them,
// refuses the forgery (and says so: exit 1), and the restored database's
// head stops at the last decision it believed.
func TestRecoverRebuildsTheLostDecisionsUpToTheFirstRefusedRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 3, nil)).Outcome)
	b.h.Stop(a)
	backup := copyDatabase(t, b.h.DatabaseURL)
	a = b.h.Start("b")
	require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k1", 100)).Outcome)
	require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k2", 100)).Outcome)
	b.h.Stop(a)
	genuine := lastOn(b.h, 0)
	forged := continueChainSigned(t, forger(t, b.h), b.h.Spec.Decisions, genuine, b.h.Signer, func(d *wire.Decision) {
		d.Source = &wire.Source{Topic: b.h.Spec.Proposals, Partition: 0, Offset: 1 << 62}
	})

	res, err := b.recover(t, func(c *verify.RecoverConfig) { c.Pool = backup })
	require.ErrorIs(t, err, verify.ErrRecordsRefused)
	r := res[0]
	require.Equal(t, verify.RecoveryRecovered, r.State, "%+v", r)
	require.Equal(t, 2, r.Decisions)
	require.Equal(t, genuine.Seq, r.To)
	require.Len(t, r.Foreign, 1)
	require.Equal(t, forged, r.Foreign[0].Offset)
	var next int64
	require.NoError(t, backup.QueryRow(context.Background(), `SELECT next_seq FROM mandated_partitions WHERE partition = 0`).Scan(&next))
	require.Equal(t, genuine.Seq+1, next)
	var auths int
	require.NoError(t, backup.QueryRow(context.Background(), `SELECT count(*) FROM authorizations`).Scan(&auths))
	require.Equal(t, 2, auths, "the two lost reservations are rebuilt")
}
