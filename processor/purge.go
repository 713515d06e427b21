package processor

import (
	"context"
	"time"
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
		for _, n := range p.ownedPartitions() {
			p.purgePartition(ctx, n)
		}
	}
}

// purgePartition runs one interval's purge of partition n.
func (p *Processor) purgePartition(ctx context.Context, n int32) {
	until := time.Now().Add(p.cfg.PurgeInterval / 4)
	var total int64
	for ctx.Err() == nil {
		k, err := p.sink.PurgeExpiredKeys(ctx, n, p.cfg.Test.Clock.Now(), p.cfg.PurgeBatch)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn().Err(err).Int32("partition", n).Msg("idempotency key purge failed; next interval retries")
			}
			break
		}
		total += k
		p.metrics.KeysPurged.Add(float64(k))
		if k < int64(p.cfg.PurgeBatch) || time.Now().After(until) {
			break
		}
	}
	if total > 0 {
		p.log.Info().Int32("partition", n).Int64("keys", total).Msg("purged expired idempotency keys")
	}
}
