// Command mandated runs one mandated instance: the processor (consumer
// group member, single writer per owned partition), the outbox relay, and
// an HTTP server for /metrics, /healthz and /readyz.
//
// Every flag can also be set by its MANDATED_* environment variable
// (--database-url is MANDATED_DATABASE_URL). SIGTERM or SIGINT stops
// fetching, finishes the batches in flight, drains the relay, leaves the
// group (so the next owners claim at once; with --instance-id the leave is
// temporary and a restart gets the same partitions back) and exits 0
// within --shutdown-timeout; a second signal exits at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// config is everything mandated can be told.
type config struct {
	kafka   cli.Kafka
	tracing cli.Tracing

	databaseURL          string
	databaseURLFile      string
	shardMap             string
	dbMaxConns           int
	lockTimeout          time.Duration
	idleInTxTimeout      time.Duration
	takeoverGrace        time.Duration
	retention            time.Duration
	proposalsTopic       string
	grantsTopic          string
	decisionsTopic       string
	deadLetterTopic      string
	group                string
	owner                string
	instanceID           string
	groupProtocol        string
	dbHandoff            time.Duration
	rewindCheck          time.Duration
	minDecisionRetention time.Duration
	tailCheck            time.Duration
	shardHandoff         time.Duration
	shardHandoffProbes   int
	shardTakeBackProbes  int
	maxBatch             int
	groupCommit          bool
	groupCommitsInFlight int
	maxRecordBytes       int
	sessionTimeout       time.Duration
	rebalanceTimeout     time.Duration
	relayMaxRows         int
	relayIdlePoll        time.Duration
	relayTxnTimeout      time.Duration
	relayLinger          time.Duration
	relayMinInterval     time.Duration
	relayTxnPrefix       string
	relayDBTimeout       time.Duration
	httpAddr             string
	shutdownTimeout      time.Duration
	logFormat            string
	logLevel             string
	failpoints           string
	grantorKeyTTL        time.Duration
}

func (c *config) register(fs *flag.FlagSet) {
	c.kafka.Register(fs)
	c.tracing.Register(fs)
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL, e.g. postgres://mandated@db:5432/mandated?sslmode=verify-full&sslrootcert=/etc/ca.pem (required)")
	fs.StringVar(&c.databaseURLFile, "database-url-file", "", "file holding the PostgreSQL URL (a mounted secret); wins over --database-url")
	fs.StringVar(&c.shardMap, "shard-map", "", "YAML file mapping partition ranges to PostgreSQL databases (README, \"Scaling out PostgreSQL\"); replaces --database-url")
	fs.IntVar(&c.dbMaxConns, "db-max-conns", int(sink.MaxConnsDefault), "PostgreSQL connection pool size")
	fs.DurationVar(&c.lockTimeout, "db-lock-timeout", sink.LockTimeoutDefault, "how long a batch waits for its partition row")
	fs.DurationVar(&c.idleInTxTimeout, "db-idle-in-transaction-timeout", sink.IdleInTxTimeoutDefault, "PostgreSQL ends a session idle inside a transaction after this (a paused owner)")
	fs.DurationVar(&c.takeoverGrace, "takeover-grace", sink.TakeoverGraceDefault, "how long a claim waits before terminating a stuck predecessor's session")
	fs.DurationVar(&c.retention, "idempotency-retention", sink.RetentionDefault, "default idempotency key retention (per-org overrides live in org_settings)")
	fs.StringVar(&c.proposalsTopic, "proposals-topic", processor.ProposalsTopicDefault, "topic of agents' commands")
	fs.StringVar(&c.grantsTopic, "grants-topic", processor.GrantsTopicDefault, "topic of grantors' commands (the only source of grant and revoke)")
	fs.StringVar(&c.decisionsTopic, "decisions-topic", processor.DecisionsTopicDefault, "topic of decisions")
	fs.StringVar(&c.deadLetterTopic, "dead-letter-topic", processor.DeadLetterTopicDefault, "topic of records no mandate can be read from")
	fs.StringVar(&c.group, "group", processor.GroupDefault, "consumer group id")
	fs.StringVar(&c.owner, "owner", "", "name of this instance in the partitions table (default --instance-id, else <hostname>-<pid>)")
	fs.StringVar(&c.instanceID, "instance-id", "", "static group membership id, unique per instance (in Kubernetes the StatefulSet pod name): a restart within the session timeout moves no partition")
	fs.StringVar(&c.groupProtocol, "group-protocol", processor.GroupProtocolDefault, "consumer (KIP-848, Kafka 4.0+: incremental, only moved partitions pause) or classic (eager range: every rebalance pauses every partition)")
	fs.DurationVar(&c.rewindCheck, "rewind-check-interval", processor.RewindCheckIntervalDefault, "how often each partition's worker reads its tail back from the decisions topic to find a database that went back in time under it (every claim checks first); negative: only at claims")
	fs.DurationVar(&c.minDecisionRetention, "min-decision-retention", processor.MinDecisionRetentionDefault, "the least retention.ms of the decisions and dead-letter topics (-1 in Kafka is forever): at least the interval between PostgreSQL backups, so that a restored database can be rebuilt from the decisions (mandatectl recover); start refuses less, compaction and retention.bytes; negative: check compaction only")
	fs.DurationVar(&c.tailCheck, "relay-tail-check-interval", outbox.TailCheckIntervalDefault, "how often the relay reads its partitions' tails back to report records another producer wrote; negative: only when it resumes a partition")
	fs.DurationVar(&c.dbHandoff, "db-unreachable-handoff", processor.DBUnreachableHandoffDefault, "leave the group after PostgreSQL has not answered this long (Kafka still does) so that others decide the partitions; rejoin when it answers; negative: never")
	fs.DurationVar(&c.shardHandoff, "shard-handoff-after", processor.ShardHandoffAfterDefault, "with a shard map: hand the partitions of one shard off after it has not answered this process this long (while another shard does), for a process that reaches it to adopt; and adopt a partition whose holder a shard has not seen this long; negative: never")
	fs.IntVar(&c.shardHandoffProbes, "shard-handoff-probes", processor.ShardHandoffProbesDefault, "failed probes in a row (over --shard-handoff-after at least) before one shard's partitions are handed off")
	fs.IntVar(&c.shardTakeBackProbes, "shard-takeback-probes", processor.ShardTakeBackProbesDefault, "answered probes in a row before the partitions of a shard handed off are claimed back")
	fs.IntVar(&c.maxBatch, "max-batch", processor.MaxBatchDefault, "most records of one partition decided in one batch")
	fs.BoolVar(&c.groupCommit, "group-commit", false, "commit the ready batches of every owned partition of a shard in one PostgreSQL transaction (each under its own fence): less PostgreSQL CPU per decision, more latency under load; false: one transaction per partition batch")
	fs.IntVar(&c.groupCommitsInFlight, "group-commits-in-flight", sink.GroupMaxInFlightDefault, "most group commits running at once per shard (batches handed over meanwhile wait and go together in the next)")
	fs.IntVar(&c.maxRecordBytes, "max-record-bytes", wire.MaxRecordBytesDefault, "largest command record decoded")
	fs.DurationVar(&c.sessionTimeout, "session-timeout", processor.SessionTimeoutDefault, "consumer group session timeout (classic protocol; with the consumer protocol the broker's group.consumer.session.timeout.ms applies)")
	fs.DurationVar(&c.rebalanceTimeout, "rebalance-timeout", processor.RebalanceTimeoutDefault, "consumer group rebalance timeout")
	fs.IntVar(&c.relayMaxRows, "relay-max-rows", outbox.MaxRowsDefault, "most outbox rows in one Kafka transaction (all the partitions of the process together)")
	fs.DurationVar(&c.relayIdlePoll, "relay-idle-poll", outbox.IdlePollDefault, "relay poll interval when no commit woke it")
	fs.DurationVar(&c.relayTxnTimeout, "relay-transaction-timeout", outbox.TransactionTimeoutDefault, "Kafka transaction timeout of the relay")
	fs.DurationVar(&c.relayLinger, "relay-linger", 0, "relay producer linger (the relay batches per transaction itself)")
	fs.DurationVar(&c.relayMinInterval, "relay-min-transaction-interval", outbox.MinTxnIntervalDefault, "least time from the end of the relay's Kafka transaction to the start of the next (rows committed meanwhile join it); negative: none")
	fs.DurationVar(&c.relayDBTimeout, "relay-database-timeout", outbox.DatabaseTimeoutDefault, "bound of every PostgreSQL call of the relay; a shard that misses it is skipped (its partitions' rows wait, the other shards' are published) and probed until it answers")
	fs.StringVar(&c.relayTxnPrefix, "relay-transactional-id-prefix", outbox.TransactionalIDDefault, "prefix of the relay's transactional id (one per process: <prefix>.<decisions topic>.proc.<random>)")
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "address of the /metrics, /healthz and /readyz server")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "bound on a graceful shutdown")
	fs.StringVar(&c.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.grantorKeyTTL, "grantor-key-refresh", processor.GrantorKeyRefreshDefault, "how old the cached grantor keys and grant_signing settings may be (a key revocation takes effect within it)")
	fs.StringVar(&c.failpoints, "failpoints", "", "fault injection for tests: name=action;... (see internal/failpoint)")
}

// serviceConfig validates and maps the flags onto the components' configs.
func (c *config) serviceConfig(log zerolog.Logger, reg prometheus.Registerer) (processor.ServiceConfig, error) {
	brokers, err := c.kafka.SeedBrokers()
	if err != nil {
		return processor.ServiceConfig{}, err
	}
	kopts, err := c.kafka.Opts()
	if err != nil {
		return processor.ServiceConfig{}, err
	}
	kopts = append(kopts, kgo.WithLogger(cli.KafkaLogger(log, kgo.LogLevelWarn)))
	// kprom keeps one client's metrics per instance, labelled by client id.
	hooks := func(string) []kgo.Hook {
		return []kgo.Hook{kprom.NewMetrics("mandated_kafka", kprom.Registerer(reg), kprom.WithClientLabel())}
	}
	dbURL, err := cli.Secret(c.databaseURL, c.databaseURLFile)
	if err != nil {
		return processor.ServiceConfig{}, fmt.Errorf("--database-url-file: %w", err)
	}
	var shards *sink.ShardMap
	switch {
	case c.shardMap != "" && dbURL != "":
		return processor.ServiceConfig{}, errors.New("--shard-map and --database-url exclude each other: the map names every database")
	case c.shardMap != "":
		if shards, err = sink.ReadShardMap(c.shardMap); err != nil {
			return processor.ServiceConfig{}, fmt.Errorf("--shard-map: %w", err)
		}
		dbURL = shards.Shards[shards.Control()].URL
	case dbURL == "":
		return processor.ServiceConfig{}, fmt.Errorf("--database-url (%s), --database-url-file or --shard-map is required", cli.EnvName("database-url"))
	}
	cfg := processor.ServiceConfig{
		Sink: sink.Config{DatabaseURL: dbURL, MaxConns: int32(c.dbMaxConns), LockTimeout: c.lockTimeout,
			IdleInTxTimeout: c.idleInTxTimeout, TakeoverGrace: c.takeoverGrace, Retention: c.retention},
		Shards: shards,
		Processor: processor.Config{Brokers: brokers, KafkaOpts: kopts, ClientHooks: hooks, Group: c.group, Owner: c.owner,
			InstanceID: c.instanceID, GroupProtocol: c.groupProtocol, DBUnreachableHandoff: c.dbHandoff, RewindCheckInterval: c.rewindCheck,
			MinDecisionRetention: c.minDecisionRetention,
			ShardHandoffAfter:    c.shardHandoff, ShardHandoffProbes: c.shardHandoffProbes, ShardTakeBackProbes: c.shardTakeBackProbes,
			ProposalsTopic: c.proposalsTopic, GrantsTopic: c.grantsTopic, DecisionsTopic: c.decisionsTopic,
			DeadLetterTopic: c.deadLetterTopic, MaxBatch: c.maxBatch, GroupCommit: c.groupCommit, GroupCommitsInFlight: c.groupCommitsInFlight, MaxRecordBytes: c.maxRecordBytes,
			SessionTimeout: c.sessionTimeout, RebalanceTimeout: c.rebalanceTimeout, GrantorKeyRefresh: c.grantorKeyTTL},
		Relay: outbox.Config{Brokers: brokers, KafkaOpts: kopts, ClientHooks: hooks, DecisionsTopic: c.decisionsTopic,
			DeadLetterTopic: c.deadLetterTopic, TransactionalIDPrefix: c.relayTxnPrefix, MaxRows: c.relayMaxRows,
			IdlePoll: c.relayIdlePoll, TransactionTimeout: c.relayTxnTimeout, Linger: c.relayLinger, TailCheckInterval: c.tailCheck,
			MinTxnInterval: c.relayMinInterval, DatabaseTimeout: c.relayDBTimeout},
		Registerer: reg,
	}
	// Validate every component now, so a bad flag is named before anything connects.
	if err := cfg.Sink.WithDefaults().Validate(); err != nil {
		return cfg, err
	}
	if err := cfg.Processor.WithDefaults().Validate(); err != nil {
		return cfg, err
	}
	if err := cfg.Relay.WithDefaults().Validate(); err != nil {
		return cfg, err
	}
	if c.shutdownTimeout <= 0 {
		return cfg, errors.New("--shutdown-timeout must be positive")
	}
	return cfg, nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var c config
	log, code, ok := cli.Daemon("mandated", "Runs the mandated processor and relay.", args, c.register, &c.logFormat, &c.logLevel)
	if !ok {
		return code
	}
	if c.failpoints == "" {
		c.failpoints = os.Getenv(failpoint.EnvVar)
	}
	if err := failpoint.EnableFromEnv(c.failpoints); err != nil {
		log.Error().Err(err).Msg("bad --failpoints")
		return 2
	}
	if c.failpoints != "" {
		log.Warn().Str("failpoints", c.failpoints).Msg("fault injection is enabled")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg, err := c.serviceConfig(log, reg)
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	tp, shutdownTracing, err := c.tracing.Provider(context.Background(), "mandated")
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	defer shutdownTracing()
	if tp != nil {
		// The decode and batch commit spans; the relay's publish spans come
		// from its producer's hooks, for decisions of traced records only.
		cfg.Processor.TracerProvider = tp
		cfg.Relay.KafkaOpts = append(slices.Clone(cfg.Relay.KafkaOpts), tracing.KafkaHooks(tp))
		log.Info().Msg("tracing on: spans exported with OTLP")
	}

	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		log.Error().Err(err).Str("addr", c.httpAddr).Msg("cannot listen")
		return 1
	}
	state := &serving{}
	srv := &http.Server{Handler: routes(state, reg), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server failed")
		}
	}()

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// SIGHUP reloads the shard map file (after mandatectl shards move; a
	// partition refused as moved reloads it as well). Caught from the
	// start: its default action would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	svc, code, ok := startWithRetry(cfg, log, state, sigs)
	if !ok {
		_ = srv.Close()
		return code
	}
	for _, s := range svc.Shards.All() {
		reg.MustRegister(sink.NewPoolCollector(s))
	}
	go func() {
		for range hup {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := svc.Shards.Reload(ctx); err != nil {
				log.Error().Err(err).Msg("SIGHUP: the shard map was not reloaded")
			}
			cancel()
		}
	}()
	ready := svc.Metrics.Ready
	stopReady := make(chan struct{})
	go watchReady(svc, ready, stopReady)
	log.Info().Str("http", ln.Addr().String()).Msg("mandated running")

	sig := <-sigs
	close(stopReady)
	ready.Set(0)
	log.Info().Str("signal", sig.String()).Dur("bound", c.shutdownTimeout).Msg("shutting down: finishing batches in flight, flushing the relay")
	go func() {
		s := <-sigs
		log.Warn().Str("signal", s.String()).Msg("second signal: exiting at once")
		os.Exit(1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	stopErr := svc.Stop(ctx)
	_ = srv.Shutdown(ctx)
	if stopErr != nil {
		log.Error().Err(stopErr).Msg("shutdown did not complete cleanly")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// serving is what the HTTP handlers see of the process.
type serving struct {
	svc     atomic.Pointer[processor.Service]
	lastErr atomic.Pointer[string]
}

// startWithRetry starts the service, retrying with backoff while Kafka or
// PostgreSQL are unreachable or the topics are not there yet; every failure
// is logged and shown by /readyz. A signal abandons the start (false, exit
// code 0); so does Kafka refusing mandated's credentials (exit code 1):
// retrying the same password cannot help.
func startWithRetry(cfg processor.ServiceConfig, log zerolog.Logger, state *serving, sigs <-chan os.Signal) (*processor.Service, int, bool) {
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			select {
			case <-sigs:
				cancel()
			case <-done:
			}
		}()
		svc, err := processor.StartService(ctx, cfg, log)
		close(done)
		canceled := ctx.Err() != nil
		cancel()
		if err == nil {
			state.svc.Store(svc)
			return svc, 0, true
		}
		if canceled {
			log.Info().Msg("signal during start-up: exiting")
			return nil, 0, false
		}
		if errors.Is(err, kerr.SaslAuthenticationFailed) {
			log.Error().Err(err).Msg("Kafka refused mandated's SASL credentials: exiting (check --kafka-sasl-user and the password)")
			return nil, 1, false
		}
		msg := err.Error()
		state.lastErr.Store(&msg)
		log.Error().Err(err).Int("attempt", attempt).Dur("retry_in", backoff).Msg("cannot start yet; retrying")
		select {
		case <-sigs:
			log.Info().Msg("signal during start-up: exiting")
			return nil, 0, false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 15*time.Second)
	}
}

// watchReady keeps the mandated_ready gauge current.
func watchReady(svc *processor.Service, g prometheus.Gauge, stop <-chan struct{}) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if svc.Ready(ctx) == nil {
			g.Set(1)
		} else {
			g.Set(0)
		}
		cancel()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

func routes(state *serving, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		svc := state.svc.Load()
		if svc == nil {
			why := "starting"
			if e := state.lastErr.Load(); e != nil {
				why += ": " + *e
			}
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := svc.Ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		owned := svc.Processor.Owned()
		_, _ = fmt.Fprintf(w, "ready: %d partitions owned\n", len(owned))
	})
	return mux
}
