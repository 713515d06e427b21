// Command mandate-gateway is mandated's HTTP gateway: per-org bearer tokens,
// commands on the authorization resources answered 200 with the decision or
// 202 with the request's status URL, status read from PostgreSQL
// (read-only), problem details with the wire's reason codes. The logic is
// package gateway; this file maps flags (and MANDATED_* variables) onto it.
//
// It serves the API on --http-addr (over TLS with --tls-cert and --tls-key)
// and /metrics, /healthz and /readyz on --ops-addr, a listener of their
// own. SIGHUP reads the shard map again (so does a change of the file,
// polled every --shard-map-poll). SIGTERM stops accepting, lets requests in
// flight finish within --shutdown-timeout and exits 0.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/gateway/console"
	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/sink"
)

// config is everything the gateway can be told; the server's own settings
// are bound onto gateway.Config (gw), its defaults the package's constants.
type config struct {
	kafka             cli.Kafka
	gw                gateway.Config
	con               console.Config
	dbMaxConns        int32
	tracing           cli.Tracing
	databaseURL       string
	databaseURLFile   string
	shardMap          string
	shardMapPoll      time.Duration
	shardUser         string
	shardPasswordFile string
	proposalsTopic    string
	grantsTopic       string
	decisionsTopic    string
	httpAddr          string
	opsAddr           string
	tlsCert           string
	tlsKey            string
	shutdownTimeout   time.Duration
	logFormat         string
	logLevel          string
	console           bool
	consoleKeys       consoleKeys
}

// consoleKeys are the --console-signing-key flags: org=KEY_ID:FILE.
type consoleKeys []string

func (k *consoleKeys) String() string { return strings.Join(*k, ",") }

func (k *consoleKeys) Set(v string) error {
	for _, one := range strings.Split(v, ",") {
		if one = strings.TrimSpace(one); one != "" {
			*k = append(*k, one)
		}
	}
	return nil
}

// signers reads the console's signing keys.
func (k consoleKeys) signers() (map[string]*client.Signer, error) {
	out := map[string]*client.Signer{}
	for _, one := range k {
		org, rest, ok1 := strings.Cut(one, "=")
		id, file, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || org == "" || id == "" || file == "" {
			return nil, fmt.Errorf("--console-signing-key %q: want org=KEY_ID:FILE", one)
		}
		if _, dup := out[org]; dup {
			return nil, fmt.Errorf("--console-signing-key: org %s twice", org)
		}
		key, err := cli.ReadSigningKey(file)
		if err != nil {
			return nil, fmt.Errorf("--console-signing-key %s: %w", org, err)
		}
		out[org] = &client.Signer{KeyID: id, Key: key}
	}
	return out, nil
}

func (c *config) register(fs *flag.FlagSet) {
	c.kafka.Register(fs)
	c.tracing.Register(fs)
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL of a role that may only read (docs/operating.md, \"The gateway's PostgreSQL role\"), e.g. postgres://mandated_gateway@db:5432/mandated?sslmode=verify-full (required without --shard-map)")
	fs.StringVar(&c.databaseURLFile, "database-url-file", "", "file holding the PostgreSQL URL (a mounted secret); wins over --database-url")
	fs.StringVar(&c.shardMap, "shard-map", "", "mandated's shard map (YAML): each status read goes to its mandate's shard, tokens to the control shard; replaces --database-url")
	fs.DurationVar(&c.shardMapPoll, "shard-map-poll", 10*time.Second, "how often the shard map file is read again for a change (SIGHUP reads it at once); 0: only on SIGHUP and when a shard says a partition moved")
	fs.StringVar(&c.shardUser, "shard-user", "", "with --shard-map: connect to every shard as this role (the gateway's read-only role) instead of the map's")
	fs.StringVar(&c.shardPasswordFile, "shard-password-file", "", "with --shard-map: file holding the password of --shard-user")
	cli.Int32Var(fs, &c.dbMaxConns, "db-max-conns", gateway.DBMaxConnsDefault, "PostgreSQL connection pool size, per shard: the most `connections` open at once")
	fs.StringVar(&c.proposalsTopic, "proposals-topic", client.ProposalsTopicDefault, "topic of agents' commands")
	fs.StringVar(&c.grantsTopic, "grants-topic", client.GrantsTopicDefault, "topic of grantors' commands (the gateway never writes it)")
	fs.StringVar(&c.decisionsTopic, "decisions-topic", client.DecisionsTopicDefault, "topic of decisions")
	fs.StringVar(&c.httpAddr, "http-addr", ":8090", "address of the API")
	fs.StringVar(&c.opsAddr, "ops-addr", ":8091", "address of /metrics, /healthz and /readyz (plain HTTP, a listener of their own: keep it off the public network)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM certificate (chain) of the API: serve HTTPS (TLS 1.2+) on --http-addr; read again when the file changes")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.DurationVar(&c.gw.DefaultWait, "default-wait", gateway.DefaultWaitDefault, "how long a command waits for its decision without Prefer: wait")
	fs.DurationVar(&c.gw.MaxWait, "max-wait", gateway.MaxWaitDefault, "upper bound of Prefer: wait")
	fs.DurationVar(&c.gw.ProduceTimeout, "produce-timeout", gateway.ProduceTimeoutDefault, "least time Kafka gets to acknowledge a command when its wait is shorter (503 with Retry-After beyond)")
	fs.Int64Var(&c.gw.MaxBodyBytes, "max-body-bytes", gateway.MaxBodyBytesDefault, "largest request body (413 beyond)")
	fs.IntVar(&c.gw.MaxRecordBytes, "max-record-bytes", gateway.MaxRecordBytesDefault, "the processors' --max-record-bytes: the record built around a body is decoded with it")
	fs.IntVar(&c.gw.MaxInFlightPerOrg, "max-in-flight-per-org", gateway.MaxInFlightPerOrgDefault, "commands of one org waiting at once (429 beyond)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", gateway.MaxWaitDefault+5*time.Second, "bound on a graceful shutdown")
	fs.BoolVar(&c.console, "console", true, "serve the operators' console under /console on --http-addr (operator tokens: mandatectl tokens create --operator)")
	fs.DurationVar(&c.con.SessionTTL, "console-session-ttl", console.SessionTTLDefault, "how long a console sign-in session lasts (sign-out ends it at once)")
	fs.Var(&c.consoleKeys, "console-signing-key", "org=KEY_ID:FILE: the console signs that org's resolves with this grantor key (PKCS#8 PEM), for an org that requires signed grantor commands (repeatable)")
	fs.StringVar(&c.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
}

func main() { os.Exit(run(os.Args[1:])) }

// readOnlyPool makes a pool (connected lazily) whose sessions cannot write,
// whatever role the URL names; user and password, when set, replace the
// URL's.
func (c *config) readOnlyPool(ctx context.Context, url, user, password string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	if user != "" {
		pcfg.ConnConfig.User, pcfg.ConnConfig.Password = user, password
	}
	pcfg.MaxConns = c.dbMaxConns
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
	gcfg := c.gw
	gcfg.Logger = &log
	if err := gcfg.WithDefaults().Validate(); err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	brokers, kopts, err := c.kafka.DaemonOpts(log)
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	dbURL, err := cli.Secret(c.databaseURL, c.databaseURLFile)
	switch {
	case err != nil:
	case c.shardMap != "" && dbURL != "":
		err = errors.New("--shard-map and --database-url exclude each other: the map names every database")
	case c.shardMap == "" && dbURL == "":
		err = fmt.Errorf("--database-url (%s), --database-url-file or --shard-map is required", cli.EnvName("database-url"))
	case (c.tlsCert == "") != (c.tlsKey == ""):
		err = errors.New("--tls-cert and --tls-key go together")
	case c.shardMap == "" && (c.shardUser != "" || c.shardPasswordFile != ""):
		err = errors.New("--shard-user and --shard-password-file need --shard-map")
	}
	var shardPassword string
	if err == nil && c.shardPasswordFile != "" {
		shardPassword, err = cli.Secret("", c.shardPasswordFile)
	}
	var certs *certLoader
	if err == nil && c.tlsCert != "" {
		certs, err = newCertLoader(c.tlsCert, c.tlsKey)
	}
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}

	tp, shutdownTracing, err := c.tracing.Provider(context.Background(), "mandate-gateway")
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	defer shutdownTracing()
	if tp != nil {
		// The server spans (otelhttp) and the produce's (kotel): the record
		// carries the request's trace to the processor.
		gcfg.TracerProvider = tp
		kopts = append(kopts, tracing.KafkaHooks(tp))
		log.Info().Msg("tracing on: spans exported with OTLP")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var pool *pgxpool.Pool
	var shards *gateway.Shards
	if c.shardMap != "" {
		shards, err = gateway.OpenShards(ctx, c.shardMap, func(ctx context.Context, url string) (*pgxpool.Pool, error) {
			return c.readOnlyPool(ctx, url, c.shardUser, shardPassword)
		}, log)
		if err != nil {
			log.Error().Err(err).Msg("shard map")
			return 2
		}
		defer shards.Close()
		pool = shards.Control()
	} else {
		if pool, err = c.readOnlyPool(ctx, dbURL, "", ""); err != nil {
			log.Error().Err(err).Msg("postgresql pool")
			return 2
		}
		defer pool.Close()
	}
	// The operations endpoints answer from the start: /readyz says why the
	// gateway is not serving yet (Kafka unreachable, the topics not created).
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var st starting
	opsLn, err := net.Listen("tcp", c.opsAddr)
	if err != nil {
		log.Error().Err(err).Str("addr", c.opsAddr).Msg("cannot listen")
		return 1
	}
	opsServer := &http.Server{Addr: c.opsAddr, Handler: st.ops(reg), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	go func() {
		if err := opsServer.Serve(opsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("ops server failed")
		}
	}()
	defer opsServer.Close()

	cl, ok := connectClient(ctx, client.Config{Brokers: brokers, KafkaOpts: kopts, ProposalsTopic: c.proposalsTopic,
		GrantsTopic: c.grantsTopic, DecisionsTopic: c.decisionsTopic, MaxRecordBytes: gcfg.MaxRecordBytes,
		DeliveryTimeout: gcfg.MaxWait, Logger: &log, DecisionKeys: sink.NewDecisionKeyCache(pool)}, &st, log)
	if !ok {
		return 0
	}
	defer cl.Close()

	srv, err := gateway.New(gcfg, cl, pool, reg)
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	if shards != nil {
		srv.WithShards(shards)
		go followShardMap(ctx, shards, c.shardMapPoll, log)
	}
	if c.console {
		signers, err := c.consoleKeys.signers()
		if err != nil {
			log.Error().Err(err).Msg("invalid configuration")
			return 2
		}
		operator := func() *sink.Operator { return sink.NewOperator(pool) }
		if shards != nil {
			operator = func() *sink.Operator { return sink.NewShardedOperator(shards.Pools()...) }
		}
		con, err := console.New(console.Config{Signers: signers, SecureCookie: certs != nil, SessionTTL: c.con.SessionTTL, Logger: &log},
			console.Sources{Client: cl, Control: pool, Operator: operator})
		if err != nil {
			log.Error().Err(err).Msg("invalid configuration")
			return 2
		}
		con.Register(srv.Mux())
	}

	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		log.Error().Err(err).Str("addr", c.httpAddr).Msg("cannot listen")
		return 1
	}
	hs := srv.HTTPServer(c.httpAddr, srv.Handler())
	if certs != nil {
		hs.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get}
	}
	go func() {
		if err := srv.Serve(hs, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server failed")
		}
	}()
	st.srv.Store(srv)
	log.Info().Str("http", ln.Addr().String()).Bool("tls", certs != nil).Str("ops", opsLn.Addr().String()).Msg("mandate-gateway running")
	<-ctx.Done()
	stop()
	log.Info().Dur("bound", c.shutdownTimeout).Msg("shutting down: finishing requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	err = hs.Shutdown(sctx)
	_ = opsServer.Shutdown(sctx)
	if err != nil {
		log.Error().Err(err).Msg("shutdown did not complete cleanly")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// followShardMap reads the shard map again on SIGHUP and every poll
// interval (a reload only swaps the routing when the file changed).
func followShardMap(ctx context.Context, shards *gateway.Shards, poll time.Duration, log zerolog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if _, err := shards.Reload(ctx); err != nil {
				log.Error().Err(err).Msg("SIGHUP: the shard map was not reloaded")
			}
		case <-tick:
			_, _ = shards.Reload(ctx) // a failure is logged and counted by Reload
		}
	}
}

// certLoader serves the certificate of --tls-cert and --tls-key, read
// again when either file changes (a rotated certificate needs no restart).
type certLoader struct {
	certFile, keyFile string

	mu       sync.Mutex
	cert     *tls.Certificate
	modified [2]time.Time
}

func newCertLoader(certFile, keyFile string) (*certLoader, error) {
	l := &certLoader{certFile: certFile, keyFile: keyFile}
	if _, err := l.get(nil); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *certLoader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	ci, err1 := os.Stat(l.certFile)
	ki, err2 := os.Stat(l.keyFile)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := errors.Join(err1, err2); err != nil {
		if l.cert != nil {
			return l.cert, nil // keep serving the last good one
		}
		return nil, fmt.Errorf("tls: %w", err)
	}
	if l.cert != nil && ci.ModTime().Equal(l.modified[0]) && ki.ModTime().Equal(l.modified[1]) {
		return l.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(l.certFile, l.keyFile)
	if err != nil {
		if l.cert != nil {
			return l.cert, nil
		}
		return nil, fmt.Errorf("tls: load --tls-cert and --tls-key: %w", err)
	}
	l.cert, l.modified = &cert, [2]time.Time{ci.ModTime(), ki.ModTime()}
	return l.cert, nil
}

// connectClient retries while Kafka or the topics are not there yet, telling
// st (and so /readyz) why; a signal abandons it.
func connectClient(ctx context.Context, cfg client.Config, st *starting, log zerolog.Logger) (*client.Client, bool) {
	b := backoff.New(time.Second, 15*time.Second)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cl, err := client.New(cctx, cfg)
		cancel()
		if err == nil {
			return cl, true
		}
		why := "cannot reach Kafka yet; retrying"
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			why = "the topics do not exist yet (create them: mandatectl topics create); retrying"
		}
		st.Failed(why + ": " + err.Error())
		log.Error().Err(err).Int("attempt", attempt).Dur("retry_in", b.Current()).Msg(why)
		if !b.Wait(ctx) {
			return nil, false
		}
	}
}

// starting is what the operations endpoints know of the gateway: nothing
// yet but the last reason it could not start, then the server.
type starting struct {
	cli.Starting
	srv atomic.Pointer[gateway.Server]
}

// ops serves /metrics, /healthz and /readyz.
func (st *starting) ops(reg *prometheus.Registry) http.Handler {
	return cli.Ops(reg, func(ctx context.Context) (string, error) {
		srv := st.srv.Load()
		if srv == nil {
			return "", st.NotReady()
		}
		return "", srv.Ready(ctx)
	})
}
