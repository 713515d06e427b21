package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Handing a partition over without fencing.
//
// One producer publishes every partition of a process, so fencing it for
// one partition that moved ends its session for all of them: each
// partition it kept pauses while it re-initializes and re-reads them (a
// second and more in a 3 → 4 scale-up, issue 35). A relay that stops
// publishing a partition releases it instead, and its next owner resumes
// after the released sequence without fencing it:
//
//  1. Revoked notes in PostgreSQL that the recorded publisher is releasing
//     the partition, with a deadline on the database's clock: its drain
//     bound (RevokeDrain) plus releaseGrace. It waits for that note (at
//     most releasingWait), so the note is written before the processor
//     acknowledges the revocation and the partition can be claimed
//     elsewhere.
//  2. The relay's loop drains what its process committed (rows of a newer
//     epoch are the next owner's), then, between two of its Kafka
//     transactions, drops the partition and records it released after the
//     last sequence it knows published (publisher_released_seq, in the row
//     a new owner reads, only while it is still the recorded publisher).
//     The loop runs one transaction at a time: every transaction of its
//     producer that carried the partition has returned committed or
//     aborted by then (a commit that failed ended the session, and the
//     next session's initialization of its own id completed or aborted it
//     before the partition could be drained again), and none will carry
//     it again: the partition is no longer held, and holding it again takes
//     a newer claim and a new record, which clears the release.
//  3. A relay taking the partition (the processor's claim check through
//     FencePredecessors, and the relay's admission) reads the recorded
//     publisher. Released: it is not fenced; the new owner records itself
//     and resumes after the higher of the released sequence and the tail
//     it reads (read_committed, after every transaction open on the
//     partition has ended, so the predecessor's last commit is in it).
//     Releasing: it waits (the admission retries every releasePoll without
//     holding the loop) until the release or the deadline. Otherwise, or
//     past the deadline, it fences as before: a dead, paused or lost owner
//     never writes the note (SIGSTOP before the revocation), or never
//     releases in time, and the fence is what ends its open transaction.
//
// A released sequence is only ever lower than or equal to what is
// committed on Kafka (the relay's published sequence moves after a commit
// or from a tail read), so resuming after it skips nothing; the new owner
// never publishes a sequence the old relay could still commit, because the
// old relay commits nothing of the partition after its release.

// releaseGrace is how long past its drain bound a releasing relay's
// release may still come (the loop notices the bound between two
// transactions).
const releaseGrace = 500 * time.Millisecond

// releasePoll is how often a relay taking a partition checks whether its
// predecessor released it.
const releasePoll = 20 * time.Millisecond

// releasingWait bounds how long Revoked waits for its releasing note.
const releasingWait = 250 * time.Millisecond

// errReleasing says the partition's recorded publisher is releasing it:
// ask again shortly.
var errReleasing = errors.New("outbox: the partition's previous publisher is releasing it")

// Handover outcomes (mandated_outbox_handovers_total).
const (
	handoverReleased          = "released"
	handoverNotReleasedInTime = "not_released_in_time"
	handoverNotReleased       = "not_released"
	handoverEarlierVersion    = "earlier_version"
)

// takeover is what a relay did about a partition's predecessors under one
// epoch: the processor's claim check and the relay's admission both ask,
// and the second one does not fence again what the first one fenced.
type takeover struct {
	epoch     int64
	publisher string
	waited    bool // saw it releasing
	done      bool // fenced, or found it released
}

// noteReleasing notes in PostgreSQL that this relay is releasing ps
// (Revoked, step 1), waiting for it at most releasingWait, and not at all
// for a DatabaseTimeout after a note that took longer: a processor handing
// off the partitions of a shard it cannot reach revokes them one after the
// other, and must not wait releasingWait for each.
func (r *Relay) noteReleasing(ps *relayPartition) {
	r.mu.Lock()
	if r.closing || !r.started || !r.gate.up(r.st.shard(ps.partition)) {
		r.mu.Unlock()
		return
	}
	done := make(chan struct{})
	r.bg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.bg.Done()
		defer close(done)
		noted, err := r.st.releasing(r.ctx, ps.partition, ps.epoch, r.txnID, r.cfg.RevokeDrain+releaseGrace)
		switch {
		case err != nil:
			ps.log.Warn().Err(err).Msg("cannot note that the relay releases the revoked partition: its next owner fences this relay's producer (every partition it publishes pauses)")
		case noted:
			ps.log.Debug().Dur("drain", r.cfg.RevokeDrain).Msg("noted that the relay releases the revoked partition once drained")
		}
	}()
	if last := r.slowNote.Load(); last != 0 && time.Since(time.Unix(0, last)) < r.cfg.DatabaseTimeout {
		return
	}
	t := time.NewTimer(releasingWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		r.slowNote.Store(time.Now().UnixNano())
	}
}

// release records ps released after its last published sequence and drops
// it (the loop, between two transactions: step 2).
func (r *Relay) release(ctx context.Context, ps *relayPartition, why string) {
	defer r.drop(ps, why)
	if !r.gate.up(r.st.shard(ps.partition)) {
		return
	}
	released, err := r.st.release(ctx, ps.partition, ps.epoch, r.txnID, ps.last)
	switch {
	case err != nil:
		if sh, ok := failedShard(err); ok {
			r.gate.failed(sh, "release", err)
		}
		r.metrics.PublishErrors.WithLabelValues("database").Inc()
		ps.log.Warn().Err(err).Int64("published_seq", ps.last).
			Msg("cannot record the partition released: its next owner fences this relay's producer once the drain deadline passes (every partition it publishes pauses)")
	case released:
		ps.log.Info().Int64("released_after_seq", ps.last).Msg("relay released the partition: its next owner resumes after it without fencing this relay")
	}
}

// takeOver deals with the relays that may have published partition since
// its previous claim, for this relay taking it under epoch (cur is what
// PostgreSQL says): a recorded publisher that released it is left alone, one
// releasing it is waited for (errReleasing), any other is fenced, and so is
// the per-partition id of an earlier version when the recorded epoch is
// not the previous one (predecessors). It returns the sequence the recorded
// publisher released the partition after (0 when it did not).
func (r *Relay) takeOver(ctx context.Context, partition int32, epoch int64, cur publisherState, what string) (int64, error) {
	var released int64
	if cur.released {
		released = cur.releasedSeq
	}
	r.mu.Lock()
	tk := r.takeovers[partition]
	if tk.epoch != epoch || tk.publisher != cur.publisher {
		tk = takeover{epoch: epoch, publisher: cur.publisher}
	}
	r.mu.Unlock()
	if tk.done {
		return released, nil
	}
	other := cur.publisher != "" && cur.publisher != r.txnID
	log := r.log.With().Int32("partition", partition).Int64("epoch", epoch).Str("previous_publisher", cur.publisher).
		Int64("previous_publisher_epoch", cur.publisherEpoch).Logger()
	var fence []string
	var outcomes []string
	switch {
	case other && cur.released:
		r.metrics.Handovers.WithLabelValues(handoverReleased).Inc()
		log.Info().Int64("released_after_seq", cur.releasedSeq).Bool("waited", tk.waited).
			Msg("the previous publisher released the partition: resuming after it without fencing it")
	case other && cur.releasing:
		if !tk.waited {
			log.Info().Msg("the previous publisher is draining the partition: waiting for its release before fencing it")
		}
		tk.waited = true
		r.mu.Lock()
		r.takeovers[partition] = tk
		r.mu.Unlock()
		return released, errReleasing
	case other:
		outcome := handoverNotReleased
		if tk.waited {
			outcome = handoverNotReleasedInTime
		}
		fence, outcomes = append(fence, cur.publisher), append(outcomes, outcome)
	}
	if legacy := r.legacyPredecessor(partition, epoch, cur); legacy != "" {
		fence, outcomes = append(fence, legacy), append(outcomes, handoverEarlierVersion)
	}
	for i, id := range fence {
		// A client id of its own: metrics hooks (kprom) register one set
		// per client id, and takeovers run concurrently.
		clientID := fmt.Sprintf("%s-%s-p%d-e%d-%d", r.clientID, what, partition, epoch, r.fences.Add(1))
		if err := r.fence(ctx, id, clientID); err != nil {
			return released, fmt.Errorf("fence the previous publisher %s: %w", id, err)
		}
		r.metrics.Handovers.WithLabelValues(outcomes[i]).Inc()
		log.Warn().Str("fenced", id).Str("reason", outcomes[i]).
			Msg("fenced the partition's previous publisher (its open transaction is aborted; every partition it publishes restarts from its tail)")
	}
	tk.done = true
	r.mu.Lock()
	r.takeovers[partition] = tk
	r.mu.Unlock()
	return released, nil
}

// legacyPredecessor is the per-partition id of a relay of an earlier
// version when the recorded publisher is not from the previous epoch (an
// owner in between did not record one); "" otherwise.
func (r *Relay) legacyPredecessor(partition int32, epoch int64, cur publisherState) string {
	if epoch > 1 && cur.publisherEpoch < epoch-1 {
		return fmt.Sprintf("%s.%s.%d", r.cfg.TransactionalIDPrefix, r.cfg.DecisionsTopic, partition)
	}
	return ""
}

// FencePredecessors deals with the relays that may have published
// partition since its previous claim (takeOver), unless the partition's
// epoch is no longer epoch: it waits while the recorded publisher is
// releasing the partition, and fences it unless it released it. The
// processor calls it after it claims a partition and before it reads the
// partition's tail back: a predecessor's open transaction is aborted (or
// its commit completed), or it has none on the partition any more, so the
// tail read sees all it will ever hold. The relay asks again when it
// admits the partition, and does not fence again what this fenced.
func (r *Relay) FencePredecessors(ctx context.Context, partition int32, epoch int64) error {
	for {
		cur, err := r.st.publisher(ctx, partition)
		if err != nil {
			return fmt.Errorf("read partition %d's epoch and publisher: %w", partition, err)
		}
		if cur.epoch != epoch {
			return nil
		}
		_, err = r.takeOver(ctx, partition, epoch, cur, "prefence")
		if !errors.Is(err, errReleasing) {
			if err != nil {
				return fmt.Errorf("partition %d: %w", partition, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(releasePoll):
		}
	}
}

// fence initializes id's producer with a throwaway client: the broker
// aborts id's open transaction (or waits for the one being committed) and
// bumps its epoch, so its producer can commit nothing more.
func (r *Relay) fence(ctx context.Context, id, clientID string) error {
	cl, err := r.client(id, clientID)
	if err != nil {
		return err
	}
	defer cl.Close()
	_, _, err = cl.ProducerID(ctx)
	return err
}
