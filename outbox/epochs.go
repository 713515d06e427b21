package outbox

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// Epochs are never handed out twice. The epoch is the fencing token: every
// write a processor or a relay makes is conditioned on the partition's
// epoch being its own. PostgreSQL hands epochs out, and a database restored
// from a backup counts from an older one; epochs on the published chain
// bound that only for epochs that published something. An epoch claimed
// after the backup and never published (an idle partition) would be handed
// out again, and a relay that lived through the restore still holding it
// would not be fenced.
//
// So every claim records its epoch on the partition of the decisions topic
// before anything is decided or published under it (RecordEpoch, called by
// the processor's claim check): a record signed by the deployment's key, in
// a transaction that is aborted, so that no read_committed consumer (the
// contract: callers, platforms, auditors, verify) ever sees it. Kafka keeps
// what a restore of PostgreSQL takes back. A tail read (ReadTail with
// TailConfig.Keys) reads the partition read_uncommitted from the record at
// PostgreSQL's published mark on — every claim made after a backup was
// recorded after that record, which was on the topic before the mark, which
// was in the backup — and counts the signed claims in Tail.Epoch: the next
// claim, and a recovery, take an epoch above every epoch ever handed out.

// claimWriter writes a relay's epoch claims with its own transactional
// producer (the relay's is busy with its transactions).
type claimWriter struct {
	mu sync.Mutex
	cl *kgo.Client
}

// RecordEpoch records on the decisions topic that partition was claimed
// under epoch (see above). It returns once the claim is written (acks=all)
// and its transaction aborted.
func (r *Relay) RecordEpoch(ctx context.Context, partition int32, epoch int64) error {
	w := &r.claims
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cl == nil {
		r.mu.Lock()
		runCtx := r.ctx
		r.mu.Unlock()
		if runCtx == nil {
			return fmt.Errorf("outbox: record epoch %d of partition %d: the relay is not started", epoch, partition)
		}
		cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(r.cfg.Brokers...)}, r.cfg.KafkaOpts...),
			kgo.TransactionalID(r.txnID+".epochs"), kgo.TransactionTimeout(r.cfg.TransactionTimeout),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))...)
		if err != nil {
			return fmt.Errorf("outbox: record epoch %d of partition %d: kafka client: %w", epoch, partition, err)
		}
		w.cl = cl
		context.AfterFunc(runCtx, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			cl.Close()
			if w.cl == cl {
				w.cl = nil
			}
		})
	}
	rec := EpochClaimRecord(r.cfg.DecisionsTopic, partition, epoch, r.cfg.Signer, time.Now())
	err := w.cl.BeginTransaction()
	if err == nil {
		err = w.cl.ProduceSync(ctx, rec).FirstErr()
		if aerr := w.cl.EndTransaction(ctx, kgo.TryAbort); err == nil {
			err = aerr
		}
	}
	if err != nil {
		// The next claim makes a new producer (a failed transaction leaves
		// this one unusable).
		w.cl.Close()
		w.cl = nil
		return fmt.Errorf("outbox: record epoch %d of partition %d on %s: %w", epoch, partition, r.cfg.DecisionsTopic, err)
	}
	r.log.Debug().Int32("partition", partition).Int64("epoch", epoch).Int64("offset", rec.Offset).Msg("epoch claim recorded on the decisions topic")
	return nil
}

// EpochClaimRecord is the record of a claim of partition under epoch,
// signed by signer at at.
func EpochClaimRecord(topic string, partition int32, epoch int64, signer *wire.RecordSigner, at time.Time) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: partition, Key: []byte(wire.EpochClaimKey), Timestamp: at,
		Headers: []kgo.RecordHeader{
			{Key: wire.HeaderEpochClaim, Value: wire.EpochClaimValue(epoch)},
			{Key: wire.HeaderSignature, Value: signer.SignEpochClaim(topic, partition, epoch)},
		}}
}

// DecisionKeys is the deployment's keys the relay checks what it reads back
// with (Config.DecisionKeys; nil when none are given).
func (r *Relay) DecisionKeys() wire.DecisionKeyring {
	if r.cfg.DecisionKeys == nil {
		return nil
	}
	return r.cfg.DecisionKeys
}

// epochClaims reads partition's records of topic in [from, to) with
// read_uncommitted and returns the highest epoch a claim signed by a key
// of ring records (0 when none).
func epochClaims(ctx context.Context, opts []kgo.Opt, topic string, partition int32, from, to int64, ring wire.DecisionKeyring) (int64, error) {
	if from >= to {
		return 0, nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords(), kgo.FetchMaxWait(200*time.Millisecond))...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	var highest int64
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err) })
		if ferr != nil {
			return 0, ferr
		}
		done := false
		fetches.EachRecord(func(rec *kgo.Record) {
			if rec.Offset >= to-1 {
				done = true
			}
			if rec.Offset >= to || rec.Attrs.IsControl() || string(rec.Key) != wire.EpochClaimKey {
				return
			}
			var v []byte
			var sig []byte
			for _, h := range rec.Headers {
				switch h.Key {
				case wire.HeaderEpochClaim:
					v = h.Value
				case wire.HeaderSignature:
					sig = h.Value
				}
			}
			epoch, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || epoch <= highest {
				return
			}
			if _, err := wire.VerifyEpochClaim(ring, sig, topic, partition, epoch, rec.Timestamp); err == nil {
				highest = epoch
			}
		})
		if done {
			return highest, nil
		}
	}
}
