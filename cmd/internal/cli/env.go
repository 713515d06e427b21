// Package cli holds what mandated's binaries share: flags that also read
// MANDATED_* environment variables, Kafka connection options (TLS, SASL),
// secrets from files, and logging.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/mandated/mandated/internal/failpoint"
)

// EnvName is the environment variable a flag reads: --kafka-sasl-user is
// MANDATED_KAFKA_SASL_USER.
func EnvName(flagName string) string {
	return "MANDATED_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ApplyEnv sets every flag not given on the command line from its
// environment variable, if set. It names the variable in any error.
func ApplyEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, e)
			}
		}
	})
	return err
}

// Secret reads a secret given directly or, preferably, from a file (as
// Kubernetes mounts them). The file wins; trailing newlines are dropped.
func Secret(value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read secret file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// List splits a comma-separated list.
func List(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Daemon parses a daemon's command line: the flags registered on a new
// flag set named name, then their MANDATED_* variables, then the logger
// from the flags logFormat and logLevel point at once parsed. When it
// returns ok false the daemon exits with code (0 for --help, 2 otherwise;
// the reason is already printed).
func Daemon(name, summary string, args []string, register func(*flag.FlagSet), logFormat, logLevel *string) (log zerolog.Logger, code int, ok bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s [flags]\n\n%s Every flag can be set by MANDATED_<FLAG> (dashes become underscores).\n\n", name, summary)
		fs.PrintDefaults()
	}
	register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return log, 0, false
		}
		return log, 2, false
	}
	if err := ApplyEnv(fs); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return log, 2, false
	}
	log, err := Logger(*logFormat, *logLevel, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return log, 2, false
	}
	return log, 0, true
}

// Int32Var defines an int32 flag (flag has none): a pool size bound
// straight onto a component's config field.
func Int32Var(fs *flag.FlagSet, p *int32, name string, value int32, usage string) {
	*p = value
	fs.Var((*int32Value)(p), name, usage)
}

type int32Value int32

func (v *int32Value) String() string { return strconv.FormatInt(int64(*v), 10) }

func (v *int32Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, 32)
	if err != nil {
		return errors.New("parse error")
	}
	*v = int32Value(n)
	return nil
}

// Failpoints enables the fault injection of --failpoints (or, when the flag
// is empty, of the environment's MANDATED_FAILPOINTS), warning that it is
// on; false after logging a bad specification.
func Failpoints(spec string, log zerolog.Logger) bool {
	if spec == "" {
		spec = os.Getenv(failpoint.EnvVar)
	}
	if err := failpoint.EnableFromEnv(spec); err != nil {
		log.Error().Err(err).Msg("bad --failpoints")
		return false
	}
	if spec != "" {
		log.Warn().Str("failpoints", spec).Msg("fault injection is enabled")
	}
	return true
}
