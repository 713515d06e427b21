// Command mandate-gateway is mandated's HTTP gateway: per-org bearer tokens,
// commands on the authorization resources answered 200 with the decision or
// 202 with a status URL, status read from PostgreSQL (read-only), problem
// details with the wire's reason codes. The logic is package gateway; this
// file maps flags (and MANDATED_* variables) onto it.
//
// It serves the API, /metrics, /healthz and /readyz on --http-addr. SIGTERM
// stops accepting, lets requests in flight finish within --shutdown-timeout
// and exits 0.
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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/sink"
)

type config struct {
	kafka           cli.Kafka
	databaseURL     string
	databaseURLFile string
	dbMaxConns      int
	shardMap        string
	proposalsTopic  string
	grantsTopic     string
	decisionsTopic  string
	httpAddr        string
	defaultWait     time.Duration
	maxWait         time.Duration
	maxBodyBytes    int64
	maxInFlight     int
	shutdownTimeout time.Duration
	logFormat       string
	logLevel        string
}

func (c *config) register(fs *flag.FlagSet) {
	c.kafka.Register(fs)
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL of a role that may only read (status and tokens), e.g. postgres://mandated_gateway@db:5432/mandated?sslmode=verify-full (required)")
	fs.StringVar(&c.databaseURLFile, "database-url-file", "", "file holding the PostgreSQL URL (a mounted secret); wins over --database-url")
	fs.StringVar(&c.shardMap, "shard-map", "", "mandated's shard map (YAML): status is read in every shard, tokens in the control shard; replaces --database-url")
	fs.IntVar(&c.dbMaxConns, "db-max-conns", 8, "PostgreSQL connection pool size (per shard)")
	fs.StringVar(&c.proposalsTopic, "proposals-topic", client.ProposalsTopicDefault, "topic of agents' commands")
	fs.StringVar(&c.grantsTopic, "grants-topic", client.GrantsTopicDefault, "topic of grantors' commands (the gateway never writes it)")
	fs.StringVar(&c.decisionsTopic, "decisions-topic", client.DecisionsTopicDefault, "topic of decisions")
	fs.StringVar(&c.httpAddr, "http-addr", ":8090", "address of the API, /metrics, /healthz and /readyz")
	fs.DurationVar(&c.defaultWait, "default-wait", gateway.DefaultWaitDefault, "how long a command waits for its decision without Prefer: wait")
	fs.DurationVar(&c.maxWait, "max-wait", gateway.MaxWaitDefault, "upper bound of Prefer: wait")
	fs.Int64Var(&c.maxBodyBytes, "max-body-bytes", gateway.MaxBodyBytesDefault, "largest request body (413 beyond)")
	fs.IntVar(&c.maxInFlight, "max-in-flight-per-org", gateway.MaxInFlightPerOrgDefault, "commands of one org waiting at once (429 beyond)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", gateway.MaxWaitDefault+5*time.Second, "bound on a graceful shutdown")
	fs.StringVar(&c.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
}

func main() { os.Exit(run(os.Args[1:])) }

// readOnlyPool makes a pool (connected lazily) whose sessions cannot write,
// whatever role the URL names.
func (c *config) readOnlyPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	pcfg.MaxConns = int32(c.dbMaxConns)
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pcfg.ConnConfig.RuntimeParams["application_name"] = "mandate-gateway"
	pcfg.ConnConfig.RuntimeParams["statement_timeout"] = "10000"
	return pgxpool.NewWithConfig(ctx, pcfg)
}

func run(args []string) int {
	var c config
	log, code, ok := cli.Daemon("mandate-gateway", "Serves mandated's HTTP API.", args, c.register, &c.logFormat, &c.logLevel)
	if !ok {
		return code
	}
	gcfg := gateway.Config{DefaultWait: c.defaultWait, MaxWait: c.maxWait, MaxBodyBytes: c.maxBodyBytes,
		MaxInFlightPerOrg: c.maxInFlight, Logger: &log}
	if err := gcfg.WithDefaults().Validate(); err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	brokers, err := c.kafka.SeedBrokers()
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	kopts, err := c.kafka.Opts()
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	kopts = append(kopts, kgo.WithLogger(cli.KafkaLogger(log, kgo.LogLevelWarn)))
	dbURL, err := cli.Secret(c.databaseURL, c.databaseURLFile)
	var shardURLs []string
	switch {
	case err != nil:
	case c.shardMap != "" && dbURL != "":
		err = errors.New("--shard-map and --database-url exclude each other: the map names every database")
	case c.shardMap != "":
		var m *sink.ShardMap
		if m, err = sink.ReadShardMap(c.shardMap); err == nil {
			dbURL = m.Shards[m.Control()].URL
			for _, s := range m.Shards {
				shardURLs = append(shardURLs, s.URL)
			}
		}
	case dbURL == "":
		err = fmt.Errorf("--database-url (%s), --database-url-file or --shard-map is required", cli.EnvName("database-url"))
	}
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := c.readOnlyPool(ctx, dbURL)
	if err != nil {
		log.Error().Err(err).Msg("postgresql pool")
		return 2
	}
	defer pool.Close()
	var shardPools []*pgxpool.Pool
	for _, u := range shardURLs {
		sp, err := c.readOnlyPool(ctx, u)
		if err != nil {
			log.Error().Err(err).Msg("postgresql pool of a shard")
			return 2
		}
		defer sp.Close()
		shardPools = append(shardPools, sp)
	}
	cl, ok := connectClient(ctx, client.Config{Brokers: brokers, KafkaOpts: kopts, ProposalsTopic: c.proposalsTopic,
		GrantsTopic: c.grantsTopic, DecisionsTopic: c.decisionsTopic, Logger: &log}, log)
	if !ok {
		return 0
	}
	defer cl.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := gateway.New(gcfg, cl, pool, reg)
	if err == nil && len(shardPools) > 0 {
		srv.WithShards(shardPools...)
	}
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	mux := http.NewServeMux()
	mux.Handle("/", srv.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := srv.Ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		log.Error().Err(err).Str("addr", c.httpAddr).Msg("cannot listen")
		return 1
	}
	hs := srv.HTTPServer(c.httpAddr, mux)
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server failed")
		}
	}()
	log.Info().Str("http", ln.Addr().String()).Msg("mandate-gateway running")
	<-ctx.Done()
	stop()
	log.Info().Dur("bound", c.shutdownTimeout).Msg("shutting down: finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Error().Err(err).Msg("shutdown did not complete cleanly")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// connectClient retries while Kafka or the decisions topic are not there
// yet; a signal abandons it.
func connectClient(ctx context.Context, cfg client.Config, log zerolog.Logger) (*client.Client, bool) {
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cl, err := client.New(cctx, cfg)
		cancel()
		if err == nil {
			return cl, true
		}
		log.Error().Err(err).Int("attempt", attempt).Dur("retry_in", backoff).Msg("cannot reach Kafka yet; retrying")
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 15*time.Second)
	}
}
