// Command demo runs mandated end to end on its embedded defaults: an
// in-process Kafka-protocol broker (franz-go's kfake) unless KAFKA_BROKERS
// is set, and the PostgreSQL at DATABASE_URL (`make demo` starts a
// throwaway one). It creates the topics, runs the processor and the relay,
// plays a scripted scenario, prints every decision as a read_committed
// consumer sees it, then a summary. It exits 0 only if every expectation held.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	var (
		brokers    = flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka seed brokers (comma separated); empty runs an embedded kfake broker")
		dbURL      = flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (required; `make demo` starts a throwaway one)")
		partitions = flag.Int("partitions", 4, "partitions of the demo topics")
		verbose    = flag.Bool("v", false, "log the pipeline's own events to stderr")
	)
	flag.Parse()
	if *dbURL == "" {
		fmt.Fprintln(os.Stderr, "demo: DATABASE_URL is not set; run `make demo`, which starts a throwaway PostgreSQL")
		os.Exit(2)
	}
	level := zerolog.WarnLevel
	if *verbose {
		level = zerolog.InfoLevel
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05.000"}).Level(level).With().Timestamp().Logger()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	seeds := splitList(*brokers)
	where := "Kafka at " + *brokers
	if len(seeds) == 0 {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: start the embedded broker:", err)
			os.Exit(1)
		}
		defer cluster.Close()
		seeds = cluster.ListenAddrs()
		where = "embedded kfake broker at " + strings.Join(seeds, ",")
	}
	fmt.Printf("mandated demo — %s, PostgreSQL at %s\n\n", where, redact(*dbURL))
	ok, err := run(ctx, seeds, *dbURL, int32(*partitions), log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// redact hides a password in a URL.
func redact(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		if at := strings.Index(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				return u[:i+3] + rest[:colon] + ":***" + rest[at:]
			}
		}
	}
	return u
}

var errExpectation = errors.New("an expectation failed")
