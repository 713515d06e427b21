package outboxrow

import "github.com/mandated/mandated/wire"

// Chain links rows (in sequence order, as a batch writes them) to the
// partition's chain whose head is prev, and returns the new head. A
// decision's payload gets its chain members appended (wire.Seal); a dead
// letter's are kept on the row and published as headers. It is what the
// single writer does inside the batch transaction, after deciding.
func Chain(rows []Row, prev wire.ChainHash) wire.ChainHash {
	for i := range rows {
		r := &rows[i]
		r.PrevHash = prev
		if r.Kind == KindDeadLetter {
			r.Hash = wire.DeadLetterHash(r.DeadLetter(), prev)
		} else {
			r.Payload, r.Hash = wire.Seal(r.Payload, prev)
		}
		prev = r.Hash
	}
	return prev
}

// DeadLetter is what the chain covers of a dead-letter row: what its
// record carries.
func (r *Row) DeadLetter() wire.DeadLetter {
	return wire.DeadLetter{Partition: r.Partition, Sequence: r.Seq, Epoch: r.Epoch, Reason: r.Reason, Detail: r.Detail,
		SourceTopic: r.SourceTopic, SourcePartition: r.SourcePartition, SourceOffset: r.SourceOffset,
		Key: r.Key, Value: r.Payload}
}
