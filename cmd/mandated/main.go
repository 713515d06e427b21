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
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/wire"
)

// config is everything mandated can be told. The flags are bound onto the
// components' own configs (svc): their defaults are the components'
// exported XxxDefault constants, and what the flags do not set (brokers,
// Kafka options, hooks) is filled in by serviceConfig.
type config struct {
	kafka   cli.Kafka
	tracing cli.Tracing
	svc     processor.ServiceConfig

	databaseURL     string
	databaseURLFile string
	shardMap        string
	httpAddr        string
	shutdownTimeout time.Duration
	logFormat       string
	logLevel        string
	failpoints      string
	decisionKeyFile string
}

func (c *config) register(fs *flag.FlagSet) {
	sk, pr, re := &c.svc.Sink, &c.svc.Processor, &c.svc.Relay
	c.kafka.Register(fs)
	c.tracing.Register(fs)
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL, e.g. postgres://mandated@db:5432/mandated?sslmode=verify-full&sslrootcert=/etc/ca.pem (required)")
	fs.StringVar(&c.databaseURLFile, "database-url-file", "", "file holding the PostgreSQL URL (a mounted secret); wins over --database-url")
	fs.StringVar(&c.shardMap, "shard-map", "", "YAML file mapping partition ranges to PostgreSQL databases (docs/operating.md, \"Scaling out PostgreSQL\"); replaces --database-url")
	cli.Int32Var(fs, &sk.MaxConns, "db-max-conns", sink.MaxConnsDefault, "PostgreSQL connection pool size: the most `connections` open at once")
	fs.DurationVar(&sk.LockTimeout, "db-lock-timeout", sink.LockTimeoutDefault, "how long a batch waits for its partition row")
	fs.DurationVar(&sk.IdleInTxTimeout, "db-idle-in-transaction-timeout", sink.IdleInTxTimeoutDefault, "PostgreSQL ends a session idle inside a transaction after this (a paused owner)")
	fs.DurationVar(&sk.TakeoverGrace, "takeover-grace", sink.TakeoverGraceDefault, "how long a claim waits before terminating a stuck predecessor's session")
	fs.DurationVar(&sk.Retention, "idempotency-retention", sink.RetentionDefault, "default idempotency key retention (per-org overrides live in org_settings)")
	fs.StringVar(&pr.ProposalsTopic, "proposals-topic", processor.ProposalsTopicDefault, "topic of agents' commands")
	fs.StringVar(&pr.GrantsTopic, "grants-topic", processor.GrantsTopicDefault, "topic of grantors' commands (the only source of grant and revoke)")
	fs.StringVar(&pr.DecisionsTopic, "decisions-topic", processor.DecisionsTopicDefault, "topic of decisions")
	fs.StringVar(&pr.DeadLetterTopic, "dead-letter-topic", processor.DeadLetterTopicDefault, "topic of records no mandate can be read from")
	fs.StringVar(&pr.Group, "group", processor.GroupDefault, "consumer group id")
	fs.StringVar(&pr.Owner, "owner", "", "name of this instance in the partitions table (default --instance-id, else <hostname>-<pid>)")
	fs.StringVar(&pr.InstanceID, "instance-id", "", "static group membership id, unique per instance (in Kubernetes the StatefulSet pod name): a restart within the session timeout moves no partition")
	fs.StringVar(&pr.GroupProtocol, "group-protocol", processor.GroupProtocolDefault, "consumer (KIP-848, Kafka 4.0+: incremental, only moved partitions pause) or classic (eager range: every rebalance pauses every partition)")
	fs.DurationVar(&pr.RewindCheckInterval, "rewind-check-interval", processor.RewindCheckIntervalDefault, "how often each partition's worker reads its tail back from the decisions topic to find a database that went back in time under it (every claim checks first); negative: only at claims")
	fs.DurationVar(&pr.MinDecisionRetention, "min-decision-retention", processor.MinDecisionRetentionDefault, "the least retention.ms of the decisions and dead-letter topics (-1 in Kafka is forever): at least the interval between PostgreSQL backups, so that a restored database can be rebuilt from the decisions (mandatectl recover); start refuses less, compaction and retention.bytes; negative: check compaction only")
	fs.DurationVar(&re.TailCheckInterval, "relay-tail-check-interval", outbox.TailCheckIntervalDefault, "how often the relay reads its partitions' tails back to report records another producer wrote; negative: only when it resumes a partition")
	fs.DurationVar(&pr.DBUnreachableHandoff, "db-unreachable-handoff", processor.DBUnreachableHandoffDefault, "leave the group after PostgreSQL has not answered this long (Kafka still does) so that others decide the partitions; rejoin when it answers; negative: never")
	fs.DurationVar(&pr.ShardHandoffAfter, "shard-handoff-after", processor.ShardHandoffAfterDefault, "with a shard map: hand the partitions of one shard off after it has not answered this process this long (while another shard does), for a process that reaches it to adopt; and adopt a partition whose holder a shard has not seen this long; negative: never")
	fs.IntVar(&pr.ShardHandoffProbes, "shard-handoff-probes", processor.ShardHandoffProbesDefault, "failed probes in a row (over --shard-handoff-after at least) before one shard's partitions are handed off")
	fs.IntVar(&pr.ShardTakeBackProbes, "shard-takeback-probes", processor.ShardTakeBackProbesDefault, "answered probes in a row before the partitions of a shard handed off are claimed back")
	fs.IntVar(&pr.MaxBatch, "max-batch", processor.MaxBatchDefault, "most records of one partition decided in one batch")
	fs.IntVar(&pr.MaxRecordBytes, "max-record-bytes", wire.MaxRecordBytesDefault, "largest command record decoded")
	fs.DurationVar(&pr.SessionTimeout, "session-timeout", processor.SessionTimeoutDefault, "consumer group session timeout (classic protocol; with the consumer protocol the broker's group.consumer.session.timeout.ms applies)")
	fs.DurationVar(&pr.RebalanceTimeout, "rebalance-timeout", processor.RebalanceTimeoutDefault, "consumer group rebalance timeout")
	fs.IntVar(&re.MaxRows, "relay-max-rows", outbox.MaxRowsDefault, "most outbox rows in one Kafka transaction (all the partitions of the process together)")
	fs.DurationVar(&re.IdlePoll, "relay-idle-poll", outbox.IdlePollDefault, "relay poll interval when no commit woke it")
	fs.DurationVar(&re.TransactionTimeout, "relay-transaction-timeout", outbox.TransactionTimeoutDefault, "Kafka transaction timeout of the relay")
	fs.DurationVar(&re.Linger, "relay-linger", 0, "relay producer linger (the relay batches per transaction itself)")
	fs.DurationVar(&re.MinTxnInterval, "relay-min-transaction-interval", outbox.MinTxnIntervalDefault, "least time from the end of the relay's Kafka transaction to the start of the next (rows committed meanwhile join it); negative: none")
	fs.DurationVar(&re.DatabaseTimeout, "relay-database-timeout", outbox.DatabaseTimeoutDefault, "bound of every PostgreSQL call of the relay; a shard that misses it is skipped (its partitions' rows wait, the other shards' are published) and probed until it answers")
	fs.StringVar(&re.TransactionalIDPrefix, "relay-transactional-id-prefix", outbox.TransactionalIDDefault, "prefix of the relay's transactional id (one per process: <prefix>.<decisions topic>.proc.<random>)")
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "address of the /metrics, /healthz and /readyz server")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "bound on a graceful shutdown")
	fs.StringVar(&c.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&pr.GrantorKeyRefresh, "grantor-key-refresh", processor.GrantorKeyRefreshDefault, "how old the cached grantor keys and grant_signing settings may be (a key revocation takes effect within it)")
	fs.StringVar(&c.decisionKeyFile, "decision-signing-key-file", "", "the deployment's Ed25519 private key (PKCS#8 PEM, a mounted secret) the relay signs every published record with (docs/security.md, \"Decisions only mandated could have written\"); default: a key generated at start, which a database restored from an older backup does not know")
	fs.StringVar(&c.failpoints, "failpoints", "", "fault injection for tests: name=action;... (see internal/failpoint)")
}

// serviceConfig validates the flags and completes the components' configs
// with what no flag sets: the brokers and Kafka options, the metrics hooks,
// the database (one URL or the shard map's control shard).
func (c *config) serviceConfig(log zerolog.Logger, reg prometheus.Registerer) (processor.ServiceConfig, error) {
	cfg := c.svc
	brokers, kopts, err := c.kafka.DaemonOpts(log)
	if err != nil {
		return cfg, err
	}
	// kprom keeps one client's metrics per instance, labelled by client id.
	hooks := func(string) []kgo.Hook {
		return []kgo.Hook{kprom.NewMetrics("mandated_kafka", kprom.Registerer(reg), kprom.WithClientLabel())}
	}
	dbURL, err := cli.Secret(c.databaseURL, c.databaseURLFile)
	if err != nil {
		return cfg, fmt.Errorf("--database-url-file: %w", err)
	}
	switch {
	case c.shardMap != "" && dbURL != "":
		return cfg, errors.New("--shard-map and --database-url exclude each other: the map names every database")
	case c.shardMap != "":
		if cfg.Shards, err = shardmap.Read(c.shardMap); err != nil {
			return cfg, fmt.Errorf("--shard-map: %w", err)
		}
		dbURL = cfg.Shards.Shards[cfg.Shards.Control()].URL
	case dbURL == "":
		return cfg, fmt.Errorf("--database-url (%s), --database-url-file or --shard-map is required", cli.EnvName("database-url"))
	}
	cfg.Sink.DatabaseURL = dbURL
	cfg.Processor.Brokers, cfg.Processor.KafkaOpts, cfg.Processor.ClientHooks = brokers, kopts, hooks
	cfg.Relay.Brokers, cfg.Relay.KafkaOpts, cfg.Relay.ClientHooks = brokers, kopts, hooks
	// The relay publishes to the processor's decisions and dead-letter topics.
	cfg.Relay.DecisionsTopic, cfg.Relay.DeadLetterTopic = cfg.Processor.DecisionsTopic, cfg.Processor.DeadLetterTopic
	cfg.Registerer = reg
	if c.decisionKeyFile != "" {
		b, err := os.ReadFile(c.decisionKeyFile)
		if err != nil {
			return cfg, fmt.Errorf("--decision-signing-key-file: %w", err)
		}
		priv, err := wire.ParsePrivateKeyPEM(b)
		if err != nil {
			return cfg, fmt.Errorf("--decision-signing-key-file %s: %w", c.decisionKeyFile, err)
		}
		cfg.Relay.Signer = wire.NewRecordSigner(priv)
	} else {
		log.Warn().Msg("no --decision-signing-key-file: signing published records with a key generated now (registered at start); a database restored from a backup taken before this start cannot verify them, so production deployments give mandated a key file (mandatectl decision-keys generate)")
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
	if !cli.Failpoints(c.failpoints, log) {
		return 2
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
	cli.Starting
	svc atomic.Pointer[processor.Service]
}

// startWithRetry starts the service, retrying with backoff while Kafka or
// PostgreSQL are unreachable or the topics are not there yet; every failure
// is logged and shown by /readyz. A signal abandons the start (false, exit
// code 0); so does Kafka refusing mandated's credentials (exit code 1):
// retrying the same password cannot help.
func startWithRetry(cfg processor.ServiceConfig, log zerolog.Logger, state *serving, sigs <-chan os.Signal) (*processor.Service, int, bool) {
	b := backoff.New(time.Second, 15*time.Second)
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
		state.Failed(err.Error())
		wait := b.Next()
		log.Error().Err(err).Int("attempt", attempt).Dur("retry_in", wait).Msg("cannot start yet; retrying")
		select {
		case <-sigs:
			log.Info().Msg("signal during start-up: exiting")
			return nil, 0, false
		case <-time.After(wait):
		}
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
	return cli.Ops(reg, func(ctx context.Context) (string, error) {
		svc := state.svc.Load()
		if svc == nil {
			return "", state.NotReady()
		}
		if err := svc.Ready(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf(": %d partitions owned", len(svc.Processor.Owned())), nil
	})
}
