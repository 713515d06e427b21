package processor

import (
	"context"

	"github.com/mandated/mandated/sink"
)

// commitBatch commits a worker's batch: through its shard's group
// committer (with the batches of the process's other partitions on that
// shard, in one transaction), or in its own transaction without GroupCommit.
// Either way the result and its errors mean the same (sink.Group.Commit).
func (p *Processor) commitBatch(ctx context.Context, store *sink.Sink, b *sink.Batch) (sink.Result, error) {
	if g := p.groups[store]; g != nil {
		return g.Commit(ctx, b)
	}
	return store.Commit(ctx, b)
}

// observeGroup counts one group commit.
func (p *Processor) observeGroup(st sink.GroupStats) {
	p.metrics.GroupPartitions.Observe(float64(st.Parts))
	if f := p.cfg.Test.OnGroupCommit; f != nil {
		f(st)
	}
}
