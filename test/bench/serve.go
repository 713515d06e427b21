package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
)

// ServeConfig is what the mandated child process runs with. Everything not
// named here takes the component defaults, as cmd/mandated does.
type ServeConfig struct {
	Brokers     []string `json:"brokers"`
	DatabaseURL string   `json:"database_url"`
	Proposals   string   `json:"proposals"`
	Grants      string   `json:"grants"`
	Decisions   string   `json:"decisions"`
	DeadLetter  string   `json:"dead_letter"`
	Group       string   `json:"group"`
	TxnPrefix   string   `json:"txn_prefix"`
	LogPath     string   `json:"log_path"`
	// RelayStall holds every relay transaction back until this long after
	// start (outbox.Config.Test.BeforePublish), as a broker outage would:
	// the outbox fills while the processor decides on. Zero: no stall.
	RelayStall time.Duration `json:"relay_stall"`
	// RelayRetryBackoff, when positive, makes the relay's producers retry
	// after this fixed backoff (kgo.RetryBackoffFn) instead of franz-go's
	// default. Zero: the default, as cmd/mandated runs.
	RelayRetryBackoff time.Duration `json:"relay_retry_backoff"`
	// RelayMetadataMinAge is the relay's outbox.Config.MetadataMinAge
	// (negative: franz-go's 5 s). Zero: the default.
	RelayMetadataMinAge time.Duration `json:"relay_metadata_min_age"`
	// RelayMinTxnInterval is the relay's outbox.Config.MinTxnInterval in
	// nanoseconds (negative: none). Zero: the default. An experiment
	// (--exp-serve '{"relay_min_txn_interval": 5000000}') compares the
	// relay's transactions per decision and its latency at every level.
	RelayMinTxnInterval time.Duration `json:"relay_min_txn_interval"`
	// RelayRetryLog counts the relay producers' franz-go debug messages
	// about retries (ServeStats.RelayRetries). Debug logging costs CPU.
	RelayRetryLog bool `json:"relay_retry_log"`
	// Shards, when set, is the shard map the service runs over, as
	// cmd/mandated --shard-map runs it (DatabaseURL is then ignored).
	Shards []ServeShard `json:"shards,omitempty"`
}

// ServeShard is one shard of ServeConfig.Shards: a shardmap.Shard.
type ServeShard struct {
	Name       string `json:"name"`
	Partitions string `json:"partitions"` // "first-last"
	URL        string `json:"url"`
}

// shardMap is cfg's shard map, nil without one.
func (cfg ServeConfig) shardMap() (*shardmap.Map, error) {
	if len(cfg.Shards) == 0 {
		return nil, nil
	}
	m := &shardmap.Map{}
	for _, s := range cfg.Shards {
		m.Shards = append(m.Shards, shardmap.Shard{Name: s.Name, Partitions: s.Partitions, URL: s.URL})
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// ServeStats is what the child reports on GET /stats.
type ServeStats struct {
	Owned            int     `json:"owned"`
	Batches          uint64  `json:"batches"`
	BatchRecords     float64 `json:"batch_records"`
	CommitSeconds    float64 `json:"commit_seconds"`
	RelayTxns        uint64  `json:"relay_txns"`
	RelayTxnSeconds  float64 `json:"relay_txn_seconds"`
	Published        float64 `json:"published"`
	PendingDeadlines float64 `json:"pending_deadlines"`
	BatchRetries     float64 `json:"batch_retries"`
	// Sums and counts of two latency histograms: a record's Kafka
	// timestamp to its batch's commit, and an outbox row's creation to
	// its Kafka transaction's commit.
	DecideSum    float64 `json:"decide_sum"`
	DecideCount  uint64  `json:"decide_count"`
	PublishSum   float64 `json:"publish_sum"`
	PublishCount uint64  `json:"publish_count"`
	// Buckets of mandated's own histograms ("decide", "commit", "publish",
	// "relay_txn", and "stage:<stage>" per stage of Stages), cumulative,
	// for quantiles per level.
	Buckets map[string][]Bucket `json:"buckets"`
	// Requests is what each Kafka request type cost the process's clients.
	Requests map[string]ReqStat `json:"requests"`
	// RelayRetries counts franz-go's retry messages (RelayRetryLog only).
	RelayRetries map[string]uint64 `json:"relay_retries,omitempty"`
}

// infBucket stands for the +Inf bucket's bound (seconds).
const infBucket = 1e6

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	LE    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// bucketQuantile is the upper bound of the bucket holding quantile q (0–1)
// of end - start (same bucket layout), in milliseconds.
func bucketQuantile(end, start []Bucket, q float64) float64 {
	if len(end) == 0 {
		return 0
	}
	total := end[len(end)-1].Count
	if len(start) == len(end) {
		total -= start[len(start)-1].Count
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	for i, b := range end {
		n := b.Count
		if len(start) == len(end) {
			n -= start[i].Count
		}
		if n >= want {
			return b.LE * 1000
		}
	}
	return infBucket * 1000
}

// HeapStats is what the child reports on GET /heap, after two full GCs.
type HeapStats struct {
	HeapAlloc   uint64 `json:"heap_alloc"`
	HeapInuse   uint64 `json:"heap_inuse"`
	HeapObjects uint64 `json:"heap_objects"`
	Sys         uint64 `json:"sys"`
	Goroutines  int    `json:"goroutines"`
}

// Serve runs one mandated instance (processor + relay, wired by
// processor.StartService exactly as cmd/mandated wires it, with kprom hooks
// and a Prometheus registry) plus a loopback HTTP server with /stats, /heap
// and /debug/pprof. It prints "LISTEN <addr>" on stdout once the processor
// has joined its group, and stops gracefully on SIGTERM.
func Serve(cfg ServeConfig) error {
	logf := os.Stderr
	if cfg.LogPath != "" {
		f, err := os.Create(cfg.LogPath)
		if err != nil {
			return err
		}
		defer f.Close()
		logf = f
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	log := zerolog.New(logf).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	requests := newReqHook()
	txns := newTxnCommitLog()
	hooks := func(string) []kgo.Hook {
		return []kgo.Hook{kprom.NewMetrics("mandated_kafka", kprom.Registerer(reg), kprom.WithClientLabel()), requests,
			newTxnClock(cfg.Decisions, txns)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	relay := outbox.Config{TransactionalIDPrefix: cfg.TxnPrefix}
	if d := cfg.RelayRetryBackoff; d > 0 {
		relay.KafkaOpts = append(relay.KafkaOpts, kgo.RetryBackoffFn(func(int) time.Duration { return d }))
	}
	relay.MetadataMinAge = cfg.RelayMetadataMinAge
	relay.MinTxnInterval = cfg.RelayMinTxnInterval
	var retries *retryLogger
	if cfg.RelayRetryLog {
		retries = newRetryLogger()
		relay.KafkaOpts = append(relay.KafkaOpts, kgo.WithLogger(retries))
	}
	if cfg.RelayStall > 0 {
		until := time.Now().Add(cfg.RelayStall)
		relay.Test.BeforePublish = func(int32, int64) { time.Sleep(time.Until(until)) }
	}
	shards, err := cfg.shardMap()
	if err != nil {
		return err
	}
	dbURL := cfg.DatabaseURL
	if shards != nil {
		// As cmd/mandated: the control shard's URL stands for the map.
		dbURL = shards.Shards[shards.Control()].URL
	}
	svc, err := processor.StartService(ctx, processor.ServiceConfig{
		Sink:   sink.Config{DatabaseURL: dbURL},
		Shards: shards,
		Processor: processor.Config{
			Brokers: cfg.Brokers, ClientHooks: hooks, Group: cfg.Group, Owner: "bench",
			ProposalsTopic: cfg.Proposals, GrantsTopic: cfg.Grants,
			DecisionsTopic: cfg.Decisions, DeadLetterTopic: cfg.DeadLetter,
		},
		Relay:      relay,
		Registerer: reg,
	}, log)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		st, err := gatherStats(reg)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		st.Owned = len(svc.Processor.Owned())
		st.Requests = requests.snapshot()
		if retries != nil {
			st.RelayRetries = retries.snapshot()
		}
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/txns", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(txns.snapshot())
	})
	mux.HandleFunc("/heap", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		debug.FreeOSMemory()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		_ = json.NewEncoder(w).Encode(HeapStats{HeapAlloc: ms.HeapAlloc, HeapInuse: ms.HeapInuse,
			HeapObjects: ms.HeapObjects, Sys: ms.Sys, Goroutines: runtime.NumGoroutine()})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("LISTEN %s\n", ln.Addr())

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	err = svc.Stop(sctx)
	_ = srv.Shutdown(sctx)
	return err
}

func gatherStats(reg *prometheus.Registry) (ServeStats, error) {
	st := ServeStats{Buckets: map[string][]Bucket{}}
	buckets := func(name string, mf *dto.MetricFamily, only ...func(*dto.Metric) bool) {
		var bs []Bucket
		for _, x := range mf.GetMetric() {
			if len(only) > 0 && !only[0](x) {
				continue
			}
			h := x.GetHistogram()
			for i, b := range h.GetBucket() {
				if i >= len(bs) {
					bs = append(bs, Bucket{LE: b.GetUpperBound()})
				}
				bs[i].Count += b.GetCumulativeCount()
			}
			if n := len(h.GetBucket()); n == len(bs) {
				bs = append(bs, Bucket{LE: infBucket}) // JSON has no +Inf
			}
			bs[len(bs)-1].Count += h.GetSampleCount()
		}
		st.Buckets[name] = bs
	}
	mfs, err := reg.Gather()
	if err != nil {
		return st, err
	}
	sum := func(m *dto.MetricFamily, f func(*dto.Metric) float64) float64 {
		var s float64
		for _, x := range m.GetMetric() {
			s += f(x)
		}
		return s
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "mandated_batch_records":
			for _, x := range mf.GetMetric() {
				st.Batches += x.GetHistogram().GetSampleCount()
				st.BatchRecords += x.GetHistogram().GetSampleSum()
			}
		case "mandated_batch_commit_seconds":
			buckets("commit", mf)
			st.CommitSeconds = sum(mf, func(x *dto.Metric) float64 { return x.GetHistogram().GetSampleSum() })
		case "mandated_outbox_transaction_seconds":
			buckets("relay_txn", mf)
			for _, x := range mf.GetMetric() {
				st.RelayTxns += x.GetHistogram().GetSampleCount()
				st.RelayTxnSeconds += x.GetHistogram().GetSampleSum()
			}
		case "mandated_outbox_published_total":
			st.Published = sum(mf, func(x *dto.Metric) float64 { return x.GetCounter().GetValue() })
		case "mandated_pending_deadlines":
			st.PendingDeadlines = sum(mf, func(x *dto.Metric) float64 { return x.GetGauge().GetValue() })
		case "mandated_proposal_decision_latency_seconds":
			buckets("decide", mf)
			for _, x := range mf.GetMetric() {
				st.DecideSum += x.GetHistogram().GetSampleSum()
				st.DecideCount += x.GetHistogram().GetSampleCount()
			}
		case "mandated_outbox_publish_latency_seconds":
			buckets("publish", mf)
			for _, x := range mf.GetMetric() {
				st.PublishSum += x.GetHistogram().GetSampleSum()
				st.PublishCount += x.GetHistogram().GetSampleCount()
			}
		case "mandated_stage_seconds", "mandated_outbox_stage_seconds":
			for _, x := range mf.GetMetric() {
				for _, l := range x.GetLabel() {
					if l.GetName() == "stage" {
						stage := l.GetValue()
						buckets(stageKey(stage), mf, func(y *dto.Metric) bool { return y == x })
					}
				}
			}
		case "mandated_batch_retries_total":
			st.BatchRetries = sum(mf, func(x *dto.Metric) float64 { return x.GetCounter().GetValue() })
		}
	}
	return st, nil
}
