package processor

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// purgeLoop deletes expired idempotency keys of every owned partition on
// its own goroutine, so a partition whose inbox never empties still
// purges. Each interval a partition's purge runs batches of PurgeBatch
// while they come back full, for at most a quarter of the interval: a
// bounded rate that keeps up with a backlog without taking the database
// from the batches.
func (p *Processor) purgeLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.PurgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, n := range p.decidingPartitions() {
			p.purgePartition(ctx, n)
		}
	}
}

// purgePartition runs one interval's purge of partition n: expired
// idempotency keys, expired intents, then expired gateway request records,
// each for at most an eighth of the interval.
func (p *Processor) purgePartition(ctx context.Context, n int32) {
	p.purgeKind(ctx, n, "idempotency keys", p.shards.For(n).PurgeExpiredKeys, p.metrics.KeysPurged)
	p.purgeKind(ctx, n, "intents", p.shards.For(n).PurgeExpiredIntents, p.metrics.IntentsPurged)
	p.purgeKind(ctx, n, "request records", p.shards.For(n).PurgeExpiredAnswers, p.metrics.RequestAnswersPurged)
}

// purgeKind deletes batches of one kind of expired row while they come
// back full, within its share of the interval.
func (p *Processor) purgeKind(ctx context.Context, n int32, what string,
	purge func(context.Context, int32, time.Time, int) (int64, error), purged prometheus.Counter) {
	until := time.Now().Add(p.cfg.PurgeInterval / 8)
	// The share is a deadline too: a shard that does not answer (a stopped
	// server) must not hold the purge of every other shard's partitions.
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var total int64
	for ctx.Err() == nil {
		k, err := purge(ctx, n, p.cfg.Test.Clock.Now(), p.cfg.PurgeBatch)
		if err != nil {
			if ctx.Err() == nil || !errors.Is(ctx.Err(), context.Canceled) {
				p.log.Warn().Err(err).Int32("partition", n).Msgf("purge of expired %s failed; next interval retries", what)
			}
			break
		}
		total += k
		purged.Add(float64(k))
		if k < int64(p.cfg.PurgeBatch) || time.Now().After(until) {
			break
		}
	}
	if total > 0 {
		p.log.Info().Int32("partition", n).Int64("rows", total).Msgf("purged expired %s", what)
	}
}
