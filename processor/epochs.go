package processor

import (
	"context"
	"fmt"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// A claim's epoch is recorded where the published ones are before anything
// is decided under it (outbox.Relay.RecordEpoch: a signed claim on the
// decisions topic, in an aborted transaction), and the claim check counts
// the claims recorded since PostgreSQL's published mark in the tail's
// epoch: a database restored from a backup never hands out again an epoch
// claimed after the backup, even one that published nothing, so a relay
// that lived through the restore under it is fenced (outbox/epochs.go).

// epochRecorder is the relay's side of a claim's epoch.
type epochRecorder interface {
	RecordEpoch(ctx context.Context, partition int32, epoch int64) error
}

// decisionKeySource gives the deployment's decision keys (the relay's).
type decisionKeySource interface {
	DecisionKeys() wire.DecisionKeyring
}

// recordEpoch records claim c's epoch, when there is a relay to.
func (p *Processor) recordEpoch(ctx context.Context, c sink.Claim) error {
	rec, ok := p.cfg.Listener.(epochRecorder)
	if !ok {
		return nil
	}
	if err := rec.RecordEpoch(ctx, c.Partition, c.Epoch); err != nil {
		return fmt.Errorf("processor: claim partition %d: %w", c.Partition, err)
	}
	return nil
}

// decisionKeys is what the claim check verifies signatures with (nil: no
// check).
func (p *Processor) decisionKeys() wire.DecisionKeyring {
	if s, ok := p.cfg.Listener.(decisionKeySource); ok {
		return s.DecisionKeys()
	}
	return nil
}
