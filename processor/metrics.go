package processor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/wire"
)

// Metrics are the processor's Prometheus metrics.
type Metrics struct {
	Decisions          *prometheus.CounterVec
	Rejections         *prometheus.CounterVec
	DeadLetters        *prometheus.CounterVec
	Misrouted          prometheus.Counter
	GrantsOnProposals  prometheus.Counter
	Executions         *prometheus.CounterVec
	StaleTokens        *prometheus.CounterVec
	DeadlineMoves      *prometheus.CounterVec
	Fenced             prometheus.Counter
	Reclaims           prometheus.Counter
	BatchRetries       *prometheus.CounterVec
	VersionConflicts   prometheus.Counter
	RecordFaults       prometheus.Counter
	AmbiguousCommits   prometheus.Counter
	BatchSize          prometheus.Histogram
	CommitSeconds      prometheus.Histogram
	DecisionLatency    prometheus.Histogram
	ConsumerLag        *prometheus.GaugeVec
	PartitionsOwned    prometheus.Gauge
	PartitionEpoch     *prometheus.GaugeVec
	TakeoverSeconds    prometheus.Histogram
	PredecessorsKilled prometheus.Counter
	InDoubt            prometheus.Gauge
	InDoubtOldest      prometheus.Gauge
	KeysPurged         prometheus.Counter
	PendingDeadlines   prometheus.Gauge
	Ready              prometheus.Gauge

	IntentReplays   prometheus.Counter
	Forks           prometheus.Counter
	PossibleReplays *prometheus.CounterVec
	IntentsPurged   prometheus.Counter
	// RequestAnswers counts decisions kept as gateway request records;
	// RequestAnswersPurged, those deleted past the org's retention.
	RequestAnswers       prometheus.Counter
	RequestAnswersPurged prometheus.Counter
	Rebalance            *RebalanceMetrics
	// ShardUp is 1 per shard while its database answers this instance's
	// probe, else 0 (labelled with the shard's partitions).
	ShardUp *prometheus.GaugeVec
	// Rewound is, per partition whose claim found Kafka ahead of
	// PostgreSQL, how many decisions Kafka holds past PostgreSQL's head.
	Rewound *prometheus.GaugeVec
	// ClaimChecks times the check every claim makes before its first
	// commit (checkClaim), by claim path and result.
	ClaimChecks *prometheus.HistogramVec
	// EpochsRaised counts claims whose epoch was raised above the highest
	// epoch on the partition's published tail (the database's counter was
	// behind it: a restore, a promoted replica).
	EpochsRaised prometheus.Counter
	// Stages is where a record waited before its decision was committed,
	// by stage: fetch (its Kafka timestamp → its worker has it), queue
	// (→ its batch starts), commit (→ the batch's PostgreSQL COMMIT). One
	// observation per record; see stages.go. The relay's stages are
	// outbox.Metrics.Stages.
	Stages *prometheus.HistogramVec

	stageFetch, stageQueue, stageCommit prometheus.Observer
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_decisions_total",
			Help: "Decisions committed, by the command they answer (\"timer\" for deadline moves) and outcome (reserved, denied, replayed, conflict, stale_version, ...).",
		}, []string{"command", "outcome"}),
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_rejections_total",
			Help: "Records answered with a rejected decision, by reason code.",
		}, []string{"reason"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_dead_letters_total",
			Help: "Records sent to the dead-letter topic because no mandate key could be read, by reason code.",
		}, []string{"reason"}),
		Misrouted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_misrouted_records_total",
			Help: "Records that arrived on a partition that is not their mandate key's home (a producer not using Kafka's murmur2 partitioner).",
		}),
		GrantsOnProposals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_grantor_commands_on_proposals_total",
			Help: "grant, revoke or resolve commands that arrived on the proposals topic and were rejected.",
		}),
		Executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_executions_total",
			Help: "Answers to begin, by outcome: started (a winner took an execution token; at most one per authorization), replayed (the winner asked again), lost (another executor was refused already_executing), refused (no execution possible: expired, revoked, not found, ...), rejected (invalid record).",
		}, []string{"outcome"}),
		StaleTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_stale_tokens_total",
			Help: "Commands refused stale_execution_token (a loser, a writer without the token, a paused executor after reconciliation), by command.",
		}, []string{"command"}),
		DeadlineMoves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_deadline_transitions_total",
			Help: "Authorizations moved by a deadline: to expired (reservation unused) or in_doubt (execution timed out).",
		}, []string{"to"}),
		Fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_fenced_commits_total",
			Help: "Batch commits refused because this owner's partition epoch was stale (another owner took over).",
		}),
		Reclaims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_partition_reclaims_total",
			Help: "Fenced partitions claimed again under a new epoch because the consumer group still assigned them to this member (a stray claimant had taken the epoch).",
		}),
		BatchRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_batch_retries_total",
			Help: "Batches decided again after a serialization failure, deadlock, lock timeout or concurrent write, by cause.",
		}, []string{"cause"}),
		VersionConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_version_conflicts_total",
			Help: "Batch writes whose compare-and-set on a mandate or authorization version failed (each retried).",
		}),
		RecordFaults: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_record_faults_total",
			Help: "Records, or deadline moves, whose writes the database refused (a constraint or trigger); isolated: a record is answered with a rejection, a deadline move is tried again a minute later.",
		}),
		AmbiguousCommits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_ambiguous_commits_total",
			Help: "Batch COMMITs whose acknowledgement was lost and that were found committed by reading the position back.",
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_batch_records",
			Help:    "Records (plus due deadlines) decided per partition batch (its own transaction).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
		}),
		CommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_batch_commit_seconds",
			Help:    "Time to commit one partition batch, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		DecisionLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_proposal_decision_latency_seconds",
			Help:    "From a record's Kafka timestamp to the commit of its decision.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mandated_consumer_lag_records",
			Help: "Records on an owned partition not yet decided (high watermark minus stored offset).",
		}, []string{"topic", "partition"}),
		PartitionsOwned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_partitions_owned",
			Help: "Partitions this processor holds a current epoch for.",
		}),
		PartitionEpoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mandated_partition_epoch",
			Help: "The epoch this processor holds for an owned partition.",
		}, []string{"partition"}),
		TakeoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_partition_claim_seconds",
			Help:    "Time to claim a partition's epoch (long when a stuck predecessor holds the partition row).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		PredecessorsKilled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_predecessor_sessions_terminated_total",
			Help: "PostgreSQL sessions of a stuck previous owner terminated during a takeover.",
		}),
		InDoubt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_in_doubt_authorizations",
			Help: "In-doubt authorizations on owned partitions (their uses stay held until resolve).",
		}),
		InDoubtOldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_in_doubt_oldest_age_seconds",
			Help: "Age of the oldest in-doubt authorization on owned partitions.",
		}),
		KeysPurged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_idempotency_keys_purged_total",
			Help: "Idempotency keys deleted by the background purge: past their retention, bound to a denial or a terminal authorization.",
		}),
		PendingDeadlines: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_pending_deadlines",
			Help: "Reservation and execution deadlines tracked in memory on owned partitions.",
		}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_ready",
			Help: "1 while this instance is ready (holds current epochs, reaches Kafka and PostgreSQL), else 0; refreshed every 5 s by cmd/mandated.",
		}),
	}
	m.IntentReplays = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mandated_intent_replays_total",
		Help: "Proposals whose intent already had an authorization, answered replayed (intent_replayed) whatever their key.",
	})
	m.Forks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mandated_forks_total",
		Help: "Forks (fork_of a terminal authorization of the same intent) that took a new use.",
	})
	m.PossibleReplays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "mandated_possible_replays_total",
		Help: "Proposals without an intent matching a committed or executing authorization within the org's replay window, by the org's policy (deny, flag).",
	}, []string{"policy"})
	m.IntentsPurged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mandated_intents_purged_total",
		Help: "Intents deleted by the background purge (retention over and the latest authorization terminal).",
	})
	m.RequestAnswers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mandated_request_answers_total",
		Help: "Decisions kept as the request record of an HTTP gateway request (records with the mandated-request header), for the org's retention.",
	})
	m.RequestAnswersPurged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mandated_request_answers_purged_total",
		Help: "Gateway request records deleted by the background purge (past the org's retention).",
	})
	m.ShardUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mandated_shard_up",
		Help: "1 while the shard's PostgreSQL answers this instance's probe (every second or so), else 0: a shard that does not answer stalls its partitions only.",
	}, []string{"shard", "partitions"})
	m.Rewound = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "mandated_partition_rewound",
		Help: "Decisions the decisions topic holds past PostgreSQL's head on a partition assigned here: PostgreSQL went back in time (a restored backup, a promoted asynchronous replica). The partition is not decided until mandatectl recover rebuilds it; 0 once it is.",
	}, []string{"partition"})
	m.ClaimChecks = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "mandated_claim_check_seconds",
		Help:    "Time from a claim to its check against the decisions topic deciding it (the tail read back, the epoch raised above the tail's), by path (assign, deferred, adopt, take_back, reclaim) and result (in_step, rewound, moved, error). No claim decides before its check.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 45},
	}, []string{"path", "result"})
	m.EpochsRaised = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "mandated_claim_epochs_raised_total",
		Help: "Claims whose epoch was raised above the highest epoch on the partition's published decisions: PostgreSQL's counter was behind what the topic carries (a restored backup, a promoted replica). Epochs only go up.",
	})
	m.Stages = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "mandated_stage_seconds",
		Help:    "Where a record waited before its decision was committed, per record, by stage: fetch (its Kafka timestamp, the producer's send time, to its partition's worker having it), queue (to its batch starting), commit (to the batch's PostgreSQL COMMIT, retries included). Their sum is mandated_proposal_decision_latency_seconds; the relay's stages are mandated_outbox_stage_seconds.",
		Buckets: outbox.StageBuckets(),
	}, []string{"stage"})
	m.stageFetch, m.stageQueue, m.stageCommit = m.Stages.WithLabelValues("fetch"), m.Stages.WithLabelValues("queue"), m.Stages.WithLabelValues("commit")
	if reg != nil {
		reg.MustRegister(m.Stages)
		reg.MustRegister(m.IntentReplays, m.Forks, m.PossibleReplays, m.IntentsPurged, m.ShardUp, m.RequestAnswers, m.RequestAnswersPurged, m.Rewound,
			m.ClaimChecks, m.EpochsRaised)
	}
	m.Rebalance = newRebalanceMetrics()
	if reg != nil {
		reg.MustRegister(m.Rebalance.collectors()...)
		reg.MustRegister(m.Decisions, m.Rejections, m.DeadLetters, m.Misrouted, m.GrantsOnProposals, m.DeadlineMoves,
			m.Fenced, m.Reclaims, m.BatchRetries, m.VersionConflicts, m.RecordFaults, m.AmbiguousCommits, m.BatchSize,
			m.CommitSeconds, m.DecisionLatency, m.ConsumerLag, m.PartitionsOwned, m.PartitionEpoch,
			m.TakeoverSeconds, m.PredecessorsKilled, m.InDoubt, m.InDoubtOldest, m.KeysPurged, m.PendingDeadlines, m.Ready)
		reg.MustRegister(m.Executions, m.StaleTokens)
	}
	return m
}

// executionOutcome labels a begin's answer for mandated_executions_total.
func executionOutcome(d *wire.Decision) string {
	switch {
	case d.Outcome == wire.OutcomeExecuting:
		return "started"
	case d.Outcome == wire.OutcomeReplayed:
		return "replayed"
	case d.Reason == wire.ReasonAlreadyExecuting:
		return "lost"
	}
	return string(d.Outcome) // refused or rejected
}
