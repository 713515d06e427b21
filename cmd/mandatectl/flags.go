package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
)

// flagSet is one command's flags with its help text. Flags registered
// through env() also read their MANDATED_* environment variable, as the
// daemon's do; a command's own flags (--org, --amount, ...) do not, so a
// stray variable in an operator's shell never changes what is sent.
type flagSet struct {
	*flag.FlagSet
	app         *app
	name        string
	synopsis    string
	description string
	examples    []string
	envFlags    map[string]bool
}

func (a *app) newFlagSet(name, synopsis, description string, examples ...string) *flagSet {
	fs := flag.NewFlagSet("mandatectl "+name, flag.ContinueOnError)
	fs.Usage = func() {}
	fs.SetOutput(a.stderr)
	return &flagSet{FlagSet: fs, app: a, name: name, synopsis: synopsis, description: description,
		examples: examples, envFlags: map[string]bool{}}
}

// env registers flags that read MANDATED_<FLAG> when not given.
func (f *flagSet) env(register func(fs *flag.FlagSet)) {
	before := map[string]bool{}
	f.VisitAll(func(fl *flag.Flag) { before[fl.Name] = true })
	register(f.FlagSet)
	f.VisitAll(func(fl *flag.Flag) {
		if !before[fl.Name] {
			f.envFlags[fl.Name] = true
		}
	})
}

func (f *flagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: mandatectl %s %s\n\n%s\n", f.name, f.synopsis, strings.TrimSpace(f.description))
	if len(f.examples) > 0 {
		fmt.Fprintf(w, "\nExamples:\n")
		for _, e := range f.examples {
			fmt.Fprint(w, indent(e))
		}
	}
	fmt.Fprintf(w, "\nFlags:\n")
	f.printFlags(w, func(name string) bool { return !f.envFlags[name] })
	if len(f.envFlags) > 0 {
		fmt.Fprintf(w, "\nConnection flags (the daemon's; each also read from MANDATED_<FLAG>, e.g. %s):\n", cli.EnvName("brokers"))
		f.printFlags(w, func(name string) bool { return f.envFlags[name] })
	}
}

// printFlags prints the flags keep selects, in flag.PrintDefaults' format.
func (f *flagSet) printFlags(w io.Writer, keep func(name string) bool) {
	sub := flag.NewFlagSet(f.Name(), flag.ContinueOnError)
	f.VisitAll(func(fl *flag.Flag) {
		if keep(fl.Name) {
			sub.Var(fl.Value, fl.Name, fl.Usage)
			sub.Lookup(fl.Name).DefValue = fl.DefValue
		}
	})
	sub.SetOutput(w)
	sub.PrintDefaults()
}

// parse parses args, allowing flags after positional arguments. It returns
// the positional arguments, or ok=false and the exit code (0 after --help).
func (f *flagSet) parse(args []string) (positional []string, code int, ok bool) {
	for {
		err := f.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			f.printHelp(f.app.stdout)
			return nil, exitOK, false
		}
		if err != nil {
			fmt.Fprintf(f.app.stderr, "run 'mandatectl %s --help' for usage\n", f.name)
			return nil, exitUsage, false
		}
		rest := f.Args()
		if len(rest) == 0 {
			break
		}
		if rest[0] == "--" {
			positional = append(positional, rest[1:]...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var envErr error
	f.VisitAll(func(fl *flag.Flag) {
		if envErr != nil || set[fl.Name] || !f.envFlags[fl.Name] {
			return
		}
		if v, found := os.LookupEnv(cli.EnvName(fl.Name)); found {
			if err := fl.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", cli.EnvName(fl.Name), v, err)
			}
		}
	})
	if envErr != nil {
		f.app.errorf("%v", envErr)
		return nil, exitUsage, false
	}
	return positional, exitOK, true
}

// usageErr reports a usage error and returns its exit code.
func (f *flagSet) usageErr(format string, args ...any) int {
	f.app.errorf("%s: "+format, append([]any{f.name}, args...)...)
	fmt.Fprintf(f.app.stderr, "run 'mandatectl %s --help' for usage\n", f.name)
	return exitUsage
}

// kafkaConn holds how to reach Kafka, registered as the daemon's flags.
type kafkaConn struct {
	cli.Kafka
	logLevel  string
	logFormat string
}

func (k *kafkaConn) register(f *flagSet) {
	f.env(func(fs *flag.FlagSet) {
		k.Kafka.Register(fs)
		fs.StringVar(&k.logLevel, "log-level", "warn", "log level of the Kafka client's own messages: debug, info, warn or error")
		fs.StringVar(&k.logFormat, "log-format", "auto", "json, console, or auto (console on a terminal)")
	})
}

// opts returns the seed brokers and client options (TLS, SASL, logging).
func (k *kafkaConn) opts(a *app) ([]kgo.Opt, error) {
	seeds, err := k.SeedBrokers()
	if err != nil {
		return nil, err
	}
	opts, err := k.Opts()
	if err != nil {
		return nil, err
	}
	log, err := logger(k.logFormat, k.logLevel, a.stderr)
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
	u, err := d.resolve()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	cfg.MaxConns = 2
	rp := cfg.ConnConfig.RuntimeParams
	rp["application_name"] = applicationName
	rp["default_transaction_read_only"] = "on"
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

// withTimeout bounds ctx by d when d is positive.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// listFlag is a repeatable flag that also splits on commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// timeFlag is a point in time: RFC 3339, or a duration from now ("90m",
// "7d", "-1h").
type timeFlag struct {
	t   time.Time
	set bool
	now func() time.Time
}

func (f *timeFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.t.Format(time.RFC3339Nano)
}

func (f *timeFlag) Set(s string) error {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		f.t, f.set = t.UTC(), true
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return errors.New("not an RFC 3339 time (2026-12-07T08:00:00Z) or a duration from now (90m, 7d)")
	}
	now := time.Now
	if f.now != nil {
		now = f.now
	}
	f.t, f.set = now().UTC().Add(d).Truncate(time.Millisecond), true
	return nil
}

// parseDuration is time.ParseDuration plus whole days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(strings.TrimPrefix(days, "+"))
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(strings.TrimPrefix(s, "+"))
}

// durationFlag accepts time.ParseDuration's syntax plus days.
type durationFlag struct{ d time.Duration }

func (f *durationFlag) String() string {
	if f == nil {
		return "0s"
	}
	return f.d.String()
}

func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	f.d = d
	return nil
}
