// Package outbox owns mandated's transactional outbox: the rows a batch
// transaction writes next to the state they describe (decisions and dead
// letters, one gapless sequence per partition), and the relay that
// publishes them to Kafka in order, exactly once, from the partition's
// owner only. Chain links the rows of a batch into the partition's hash
// chain before they are written; the relay publishes the sealed bytes as
// they are stored, so a replay republishes identical records.
//
// It must never decide anything: it moves what the processor committed.
//
// It stands on wire, lifecycle, partitioner and internal/failpoint
// (test/layout). It must never import sink (the batch transaction writes
// outbox rows, so sink stands on outbox, not the reverse), verify (the
// auditor checks the relay's work), processor, client or gateway.
package outbox
