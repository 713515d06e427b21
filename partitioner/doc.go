// Package partitioner owns the identity of a mandate on the wire and in
// Kafka: the mandate key ("<org>/<mandate_id>"), the partition a key lives
// on (the Kafka Java client's default partitioner, murmur2), and the
// ownership of partitions by one processor at a time (epochs claimed in the
// database when Kafka assigns a partition, released when it is revoked).
//
// It must never decide anything about a mandate; it only says where a
// mandate lives and who may write it.
//
// It is the ground floor of the house (test/layout): it must never import
// any package of mandated's; every other package may stand on it.
package partitioner
