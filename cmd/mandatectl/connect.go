package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
)

// How mandatectl reaches Kafka and PostgreSQL: the daemon's connection
// flags (each also read from its MANDATED_* variable), the Kafka client
// options they make, and the pools and connections they open, routed by
// the shard map when there is one. A command declares the connections it
// needs in its options; it opens them in its run.

// kafkaConn holds how to reach Kafka, registered as the daemon's flags.
type kafkaConn struct {
	cli.Kafka
	logLevel  string
	logFormat string
	logTo     io.Writer // the Kafka client's own messages: the invocation's stderr
}

func (k *kafkaConn) register(f *flagSet) {
	k.logTo = f.app.stderr
	f.env(func(fs *flag.FlagSet) {
		k.Kafka.Register(fs)
		fs.StringVar(&k.logLevel, "log-level", "warn", "log level of the Kafka client's own messages: debug, info, warn or error")
		fs.StringVar(&k.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	})
}

// opts returns the seed brokers and client options (TLS, SASL, logging).
func (k *kafkaConn) opts() ([]kgo.Opt, error) {
	seeds, err := k.SeedBrokers()
	if err != nil {
		return nil, err
	}
	opts, err := k.Opts()
	if err != nil {
		return nil, err
	}
	log, err := logger(k.logFormat, k.logLevel, k.logTo)
	if err != nil {
		return nil, err
	}
	return append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ClientID("mandatectl"),
		kgo.WithLogger(cli.KafkaLogger(log, kgoLevel(log.GetLevel())))}, opts...), nil
}

func logger(format, level string, w io.Writer) (zerolog.Logger, error) {
	if f, ok := w.(*os.File); ok {
		return cli.Logger(format, level, f)
	}
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q is not one of debug, info, warn, error", level)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

func kgoLevel(l zerolog.Level) kgo.LogLevel {
	switch {
	case l <= zerolog.DebugLevel:
		return kgo.LogLevelDebug
	case l == zerolog.InfoLevel:
		return kgo.LogLevelInfo
	case l == zerolog.WarnLevel:
		return kgo.LogLevelWarn
	default:
		return kgo.LogLevelError
	}
}

// topicNames are the daemon's topic flags, with its defaults.
type topicNames struct {
	proposals, grants, decisions, deadLetter string
}

func (t *topicNames) register(f *flagSet) {
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&t.proposals, "proposals-topic", processor.ProposalsTopicDefault, "topic of agents' commands")
		fs.StringVar(&t.grants, "grants-topic", processor.GrantsTopicDefault, "topic of grantors' commands (grant, revoke)")
		fs.StringVar(&t.decisions, "decisions-topic", processor.DecisionsTopicDefault, "topic of decisions")
		fs.StringVar(&t.deadLetter, "dead-letter-topic", processor.DeadLetterTopicDefault, "topic of records no mandate can be read from")
	})
}

// dbConn holds how to reach PostgreSQL, registered as the daemon's flags.
type dbConn struct {
	url      string
	urlFile  string
	shardMap string
	shard    *shardmap.Shard // set on the per-shard copies shards returns
}

func (d *dbConn) register(f *flagSet) {
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL, e.g. postgres://mandated@db:5432/mandated?sslmode=verify-full (required unless --shard-map)")
		fs.StringVar(&d.urlFile, "database-url-file", "", "file holding the PostgreSQL URL (a mounted secret); wins over --database-url")
		fs.StringVar(&d.shardMap, "shard-map", "", "the daemon's shard map (YAML): partitions are read in their shard's database; org settings, grantor keys and gateway tokens in the control shard's")
	})
}

// readMap reads --shard-map.
func (d *dbConn) readMap() (*shardmap.Map, error) {
	if d.url != "" || d.urlFile != "" {
		return nil, errors.New("--shard-map and --database-url exclude each other: the map names every database")
	}
	m, err := shardmap.Read(d.shardMap)
	if err != nil {
		return nil, fmt.Errorf("--shard-map: %w", err)
	}
	return m, nil
}

// shards returns one connection per shard of --shard-map (each resolving
// to its shard's database), or d itself without a map.
func (d *dbConn) shards() ([]*dbConn, error) {
	if d.shardMap == "" || d.shard != nil {
		return []*dbConn{d}, nil
	}
	m, err := d.readMap()
	if err != nil {
		return nil, err
	}
	out := make([]*dbConn, len(m.Shards))
	for i := range m.Shards {
		out[i] = &dbConn{shard: &m.Shards[i]}
	}
	return out, nil
}

// name is the shard's name, or "" without a map.
func (d *dbConn) name() string {
	if d.shard == nil {
		return ""
	}
	return d.shard.Name
}

// pools opens a read-only pool on every shard (pool); close closes them.
func (d *dbConn) pools(ctx context.Context) (pools []*pgxpool.Pool, close func(), err error) {
	close = func() {
		for _, p := range pools {
			p.Close()
		}
	}
	all, err := d.shards()
	if err != nil {
		return nil, close, err
	}
	for _, one := range all {
		p, err := one.pool(ctx)
		if err != nil {
			close()
			if one.shard != nil {
				err = fmt.Errorf("shard %s: %w", one.shard.Name, err)
			}
			return nil, func() {}, err
		}
		pools = append(pools, p)
	}
	return pools, close, nil
}

// operator answers operator queries across every shard.
func (d *dbConn) operator(ctx context.Context) (*sink.Operator, func(), error) {
	pools, close, err := d.pools(ctx)
	if err != nil {
		return nil, close, err
	}
	return sink.NewShardedOperator(pools...), close, nil
}

// applicationName is what mandatectl's sessions call themselves. It must
// not be the daemon's: a takeover terminates blocking sessions by that name.
const applicationName = "mandatectl"

// resolve returns the database URL: with --shard-map, the control
// shard's (where org settings, grantor keys and tokens live).
func (d *dbConn) resolve() (string, error) {
	if d.shard != nil {
		return d.shard.URL, nil
	}
	if d.shardMap != "" {
		m, err := d.readMap()
		if err != nil {
			return "", err
		}
		return m.Shards[m.Control()].URL, nil
	}
	u, err := cli.Secret(d.url, d.urlFile)
	if err != nil {
		return "", fmt.Errorf("--database-url-file: %w", err)
	}
	if u == "" {
		return "", fmt.Errorf("--database-url (%s), --database-url-file or --shard-map is required", cli.EnvName("database-url"))
	}
	return u, nil
}

// pool opens a small pool whose transactions are read-only: operator
// queries cannot change anything, whatever a bug in them would try.
func (d *dbConn) pool(ctx context.Context) (*pgxpool.Pool, error) {
	return d.openPool(ctx, 2, true)
}

// openPool opens a pool of at most maxConns connections, read-only or
// not, with a 60 s statement timeout, and checks it answers.
func (d *dbConn) openPool(ctx context.Context, maxConns int32, readOnly bool) (*pgxpool.Pool, error) {
	u, err := d.resolve()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	cfg.MaxConns = maxConns
	rp := cfg.ConnConfig.RuntimeParams
	rp["application_name"] = applicationName
	if readOnly {
		rp["default_transaction_read_only"] = "on"
	}
	rp["statement_timeout"] = "60000"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// conn opens one read-write connection (for migrate).
func (d *dbConn) conn(ctx context.Context) (*pgx.Conn, error) {
	u, err := d.resolve()
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	cfg.RuntimeParams["application_name"] = applicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return conn, nil
}

// writablePool opens a one-connection read-write pool (org-settings set:
// the only operator change besides migrate).
func (d *dbConn) writablePool(ctx context.Context) (*pgxpool.Pool, error) {
	return d.openPool(ctx, 1, false)
}

// recoverPools opens a read-write pool on every shard of m, in its order
// (on the one database without a map), without a statement timeout (a
// large recovery writes for a while; --timeout bounds the run).
func recoverPools(ctx context.Context, db *dbConn, m *shardmap.Map) ([]*pgxpool.Pool, error) {
	all := []*dbConn{db}
	if m != nil {
		all = make([]*dbConn, len(m.Shards))
		for i := range m.Shards {
			all[i] = &dbConn{shard: &m.Shards[i]}
		}
	}
	var pools []*pgxpool.Pool
	for _, one := range all {
		u, err := one.resolve()
		if err != nil {
			return pools, err
		}
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return pools, fmt.Errorf("--database-url: %w", err)
		}
		cfg.MaxConns = 8 // up to four partitions at a time, each reading and writing
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
			pools = append(pools, pool)
		}
		if err != nil {
			if one.shard != nil {
				err = fmt.Errorf("shard %s: %w", one.shard.Name, err)
			}
			return pools, fmt.Errorf("connect to PostgreSQL: %w", err)
		}
	}
	return pools, nil
}
