package outbox

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the relay's Prometheus metrics.
type Metrics struct {
	Published      *prometheus.CounterVec
	PublishSeconds prometheus.Histogram
	TxnSeconds     prometheus.Histogram
	PublishErrors  *prometheus.CounterVec
	Parked         prometheus.Counter
	RowByRow       prometheus.Counter
	ParkedRows     prometheus.Gauge
	Backlog        *prometheus.GaugeVec
	OldestAge      prometheus.Gauge
	Resumes        prometheus.Counter
	Fenced         prometheus.Counter
	Deleted        prometheus.Counter
	Gaps           prometheus.Counter
	ForeignRecords *prometheus.CounterVec
	// ShardErrors counts the relay's PostgreSQL calls (and probes) to a
	// shard that failed or missed their deadline.
	ShardErrors *prometheus.CounterVec
	// ShardSkipped is 1 while the relay skips a shard.
	ShardSkipped *prometheus.GaugeVec
	// Handovers counts, by outcome, how a relay taking a partition dealt
	// with the other relay recorded as its publisher (handover.go).
	Handovers *prometheus.CounterVec
	// FromMemory counts the rows published from memory (handed over by
	// the processor at its commit), not loaded from PostgreSQL.
	FromMemory prometheus.Counter
	// MarkSeconds is the time of the marks (published sequences), written
	// off the path between Kafka transactions.
	MarkSeconds prometheus.Histogram
	// HousekeepSeconds is the time of one housekeeping (published rows
	// deleted, the decision history's copy included), which nothing waits
	// for.
	HousekeepSeconds prometheus.Histogram
	// Stages is where a published row waited, by stage: relay_wait (its
	// batch's PostgreSQL commit → the relay took it, from memory or
	// PostgreSQL, for the transaction that published it) and relay_txn
	// (→ the Kafka transaction committed). One observation per row; see
	// stages.go.
	Stages *prometheus.HistogramVec
	// Signatures counts the records' signatures the relay made, by where:
	// handover (as the processor handed the row over at its commit, on its
	// goroutine) or publish (a row read from PostgreSQL, in the relay's
	// transaction).
	Signatures *prometheus.CounterVec

	relayWait, relayTxn               prometheus.Observer
	signedAtHandover, signedAtPublish prometheus.Counter
}

// StageBuckets are the bucket bounds of the stage histograms
// (mandated_stage_seconds, mandated_outbox_stage_seconds): 0.25 ms to about
// 30 s, each bound 1.2× the last, so that a quantile interpolated within a
// bucket (histogram_quantile) is within about 10 % of the true one.
func StageBuckets() []float64 { return prometheus.ExponentialBuckets(0.00025, 1.2, 65) }

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_outbox_published_total",
			Help: "Outbox rows published in committed Kafka transactions, by kind (decision, dead_letter).",
		}, []string{"kind"}),
		PublishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_outbox_publish_latency_seconds",
			Help:    "From an outbox row's commit in PostgreSQL to its Kafka transaction's commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		TxnSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_outbox_transaction_seconds",
			Help:    "Time to produce and commit one relay Kafka transaction (all partitions of the process together).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		PublishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_outbox_publish_errors_total",
			Help: "Relay publish attempts that failed, by kind (produce, commit, fenced, database, resume).",
		}, []string{"kind"}),
		Parked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_parked_total",
			Help: "Outbox rows the broker refused for good (too large, invalid), moved to outbox_parked.",
		}),
		RowByRow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_row_by_row_retries_total",
			Help: "Kafka transactions the broker refused as a whole, retried one row per transaction (only a row refused alone is parked).",
		}),
		ParkedRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_outbox_parked_rows",
			Help: "Rows currently in outbox_parked (list them with mandatectl parked).",
		}),
		Backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mandated_outbox_backlog_rows",
			Help: "Outbox rows committed but not yet published, per owned partition.",
		}, []string{"partition"}),
		OldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_outbox_oldest_unpublished_age_seconds",
			Help: "Age of the oldest unpublished outbox row on owned partitions.",
		}),
		Resumes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_resumes_total",
			Help: "Partitions resumed by the relay (after the last sequence found on Kafka or in PostgreSQL), at assignment and after every session restart.",
		}),
		Fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_fenced_total",
			Help: "Relay sessions ended because their producer was fenced, and partitions dropped because a newer owner took them.",
		}),
		Deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_rows_deleted_total",
			Help: "Published outbox rows deleted by housekeeping.",
		}),
		Gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_sequence_gaps_total",
			Help: "Times the relay found a missing outbox sequence that is not parked (it waits; this should never happen).",
		}),
		ForeignRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_relay_foreign_records_total",
			Help: "Records on a decisions or dead-letter partition that are not on the partition's chain as PostgreSQL holds it (another producer wrote them), found by the relay's tail reads; each counted once per process, never believed.",
		}, []string{"partition"}),
		ShardErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_outbox_shard_errors_total",
			Help: "Relay calls to a shard's PostgreSQL (and probes of a skipped shard) that failed or missed the relay's database deadline, by shard.",
		}, []string{"shard"}),
		ShardSkipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "mandated_outbox_shard_skipped",
			Help: "1 while the relay skips a shard that does not answer (its partitions' rows wait; the other shards' are published), else 0.",
		}, []string{"shard"}),
		Handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_outbox_handovers_total",
			Help: "Partitions taken from another relay, by outcome: released (it drained and released the partition: not fenced), not_released_in_time (fenced once its drain deadline passed), not_released (no release under way, a dead, paused or lost owner: fenced at once), earlier_version (a per-partition id of an earlier version fenced).",
		}, []string{"outcome"}),
		FromMemory: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_outbox_rows_from_memory_total",
			Help: "Outbox rows the relay took from memory (handed over by this process's processor at its commit) rather than loading them from PostgreSQL.",
		}),
		MarkSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_outbox_mark_seconds",
			Help:    "Time to record published sequences (one round trip per shard), off the path: the next Kafka transaction is taken and produced meanwhile, and its commit waits for it.",
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16),
		}),
		HousekeepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_outbox_housekeep_seconds",
			Help:    "Time to delete a pass of published outbox rows (one transaction per shard; a trigger copies each deleted decision into decision_history): in the background, nothing waits for it.",
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16),
		}),
		Stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "mandated_outbox_stage_seconds",
			Help:    "Where a published outbox row waited, per row, by stage: relay_wait (its batch's PostgreSQL commit to the relay taking it, from memory or PostgreSQL, for the transaction that published it; only rows committed by this process's processor since the relay took the partition) and relay_txn (that to the Kafka transaction's commit). The processor's stages are mandated_stage_seconds.",
			Buckets: StageBuckets(),
		}, []string{"stage"}),
		Signatures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_outbox_signatures_total",
			Help: "Record signatures (mandated-signature) the relay made, by where: handover (as this process's processor handed the row over at its commit, on the committing worker, off the relay's publishing loop) or publish (a row read from PostgreSQL, in the relay's transaction).",
		}, []string{"at"}),
	}
	m.relayWait, m.relayTxn = m.Stages.WithLabelValues("relay_wait"), m.Stages.WithLabelValues("relay_txn")
	m.signedAtHandover, m.signedAtPublish = m.Signatures.WithLabelValues("handover"), m.Signatures.WithLabelValues("publish")
	if reg != nil {
		reg.MustRegister(m.Handovers, m.Signatures)
		reg.MustRegister(m.Stages)
		reg.MustRegister(m.Published, m.PublishSeconds, m.TxnSeconds, m.PublishErrors, m.Parked, m.RowByRow, m.ParkedRows,
			m.Backlog, m.OldestAge, m.Resumes, m.Fenced, m.Deleted, m.Gaps, m.ForeignRecords, m.ShardErrors, m.ShardSkipped,
			m.FromMemory, m.MarkSeconds, m.HousekeepSeconds)
	}
	return m
}
