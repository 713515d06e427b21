package wire

// The topic names of the contract, defined once: the processor, the relay,
// the clients and the operators' tools default to them (each component's
// Config may name others, e.g. per environment).
const (
	// ProposalsTopic carries agents' and platforms' commands: propose,
	// begin, commit, cancel, report_unknown, resolve.
	ProposalsTopic = "mandate.proposals"
	// GrantsTopic carries the control plane's commands: grant, revoke.
	GrantsTopic = "mandate.grants"
	// DecisionsTopic carries the decisions, one chained sequence per partition.
	DecisionsTopic = "mandate.decisions"
	// DeadLetterTopic carries the records no mandate can be read from.
	DeadLetterTopic = "mandate.deadletter"
	// ProcessorGroup is the processors' consumer group: the operators' tools
	// (repartition, kafka-consumer-groups) find the processors by it.
	ProcessorGroup = "mandated"
)
