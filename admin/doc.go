// Package admin is mandated's operator layer, as franz-go's kadm is kgo's:
// the workflows an operator runs (mandatectl, the console) beside the
// runtime rather than inside it. It owns moving a partition to another
// shard (MovePartition, DropMoved), changing the partition count
// (Repartition: the topics, the consumer group and the database together;
// RepartitionDatabase, its one PostgreSQL transaction; the sharded plan),
// the operators' writes of org settings (retention, possible-replay
// window), grantor keys and grant signing, the verify-run records, the
// Kafka ACLs each role needs (PlanACLs, ApplyACLs), and the partition
// health view (Partitions: the stored progress against Kafka's end offsets
// and the group's assignment).
//
// It stands on sink (the runtime's storage: the fence, the batch, the
// moves it reads), sink/shardmap (the map file it edits), sink/pgerr (the
// one SQLSTATE translation) and processor (the topic and group defaults).
// The runtime never imports it (test/layout): a daemon decides and
// commits without it. Recovering a partition from its published decisions
// stays in verify (verify.Recover, which rebuilds the rows) and sink
// (sink.Recover, which writes them through the batch's own statements).
package admin
