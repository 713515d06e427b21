// Command mandate-mcp is an MCP server in front of one upstream MCP server
// whose tool calls it makes exactly once: the tools named in --rules are
// guarded by mandates (propose, begin, forward, commit with the recorded
// result), the others pass through unchanged. The logic is package
// mcpguard; this file maps flags (and MANDATED_* variables) onto it.
//
// It serves MCP on stdio (the default: an agent starts it as a command) or
// streamable HTTP on --http-addr, and /metrics, /healthz and /readyz on
// --ops-addr. Logs go to stderr, never to stdout (stdio is the protocol).
package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/mcpguard"
)

const summary = `Serves MCP in front of one upstream MCP server, making the calls of the
tools named in --rules exactly once under mandates (the others pass through).

Examples:

  # An agent starts it as its MCP server over stdio; the upstream is a command.
  mandate-mcp --brokers kafka:9092 --rules /etc/mandated/mcp-rules.yaml \
      --upstream-command "python -m payments_mcp"

  # Streamable HTTP on :8092 in front of an upstream reached over HTTP.
  MANDATED_BROKERS=kafka:9092 mandate-mcp --rules rules.yaml \
      --upstream-url http://payments-mcp:8000/mcp --http-addr :8092

  # The rules file (YAML or JSON):
  #   tools:
  #     refund:
  #       org: acme
  #       mandate_id: "case-{case_id}"
  #       operation: payment.refund
  #       amount: {minor_units: "{amount_cents}", currency: EUR}
  #       target: "{order_id}"
  #       intent: {from: meta}      # the call's _meta run_id and step

An in-doubt tool error is settled by an operator: mandatectl reconcile.`

type config struct {
	kafka           cli.Kafka
	rules           string
	upstreamCommand string
	upstreamURL     string
	httpAddr        string
	opsAddr         string
	proposalsTopic  string
	grantsTopic     string
	decisionsTopic  string
	callTimeout     time.Duration
	loserWait       time.Duration
	upstreamTimeout time.Duration
	maxResultBytes  int
	sessionTimeout  time.Duration
	shutdownTimeout time.Duration
	failpoints      string
	logFormat       string
	logLevel        string
}

func (c *config) register(fs *flag.FlagSet) {
	c.kafka.Register(fs)
	fs.StringVar(&c.rules, "rules", "", "the guarded tools (YAML or JSON file; docs/mcp.md, \"mandate-mcp\") (required)")
	fs.StringVar(&c.upstreamCommand, "upstream-command", "", "run the upstream MCP server as this command over stdio (split at spaces)")
	fs.StringVar(&c.upstreamURL, "upstream-url", "", "the upstream MCP server's streamable-HTTP endpoint, e.g. http://payments-mcp:8000/mcp")
	fs.StringVar(&c.httpAddr, "http-addr", "", "serve MCP over streamable HTTP on this address; empty: serve one client over stdio")
	fs.StringVar(&c.opsAddr, "ops-addr", ":8093", "address of /metrics, /healthz and /readyz (plain HTTP; empty: none)")
	fs.StringVar(&c.proposalsTopic, "proposals-topic", client.ProposalsTopicDefault, "topic of agents' commands")
	fs.StringVar(&c.grantsTopic, "grants-topic", client.GrantsTopicDefault, "topic of grantors' commands (never written)")
	fs.StringVar(&c.decisionsTopic, "decisions-topic", client.DecisionsTopicDefault, "topic of decisions")
	fs.DurationVar(&c.callTimeout, "call-timeout", mcpguard.CallTimeoutDefault, "bound on one guarded call (decisions, upstream, waiting for a concurrent call's result)")
	fs.DurationVar(&c.loserWait, "loser-wait", client.LoserWaitDefault, "bound on waiting for another executor's execution of the same intent (a concurrent call, or a mandate-mcp that died before its commit): then the call answers in progress, naming the executor, since when, and when it becomes reconcilable")
	fs.DurationVar(&c.upstreamTimeout, "upstream-timeout", mcpguard.UpstreamTimeoutDefault, "bound on the forwarded call: past it the outcome is unknown and the call in doubt (keep it below the mandates' execution timeout)")
	fs.IntVar(&c.maxResultBytes, "max-result-bytes", mcpguard.MaxResultBytesDefault, "largest recorded result; above it a repeat gets the result's beginning, size and SHA-256")
	fs.DurationVar(&c.sessionTimeout, "session-timeout", mcpguard.SessionTimeoutDefault, "with --http-addr: close an agent's session idle this long")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "bound on a graceful shutdown")
	fs.StringVar(&c.failpoints, "failpoints", "", "fault injection for tests: name=action;... (see internal/failpoint)")
	fs.StringVar(&c.logFormat, "log-format", "json", "json, console, or auto (console on a terminal); always on stderr")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	var c config
	log, code, ok := cli.Daemon("mandate-mcp", summary, args, c.register, &c.logFormat, &c.logLevel)
	if !ok {
		return code
	}
	if !cli.Failpoints(c.failpoints, log) {
		return 2
	}
	if c.rules == "" {
		log.Error().Str("env", cli.EnvName("rules")).Msg("invalid configuration: --rules is required")
		return 2
	}
	switch {
	case c.upstreamCommand == "" && c.upstreamURL == "":
		log.Error().Msg("invalid configuration: --upstream-command or --upstream-url is required (the MCP server to guard)")
		return 2
	case c.upstreamCommand != "" && c.upstreamURL != "":
		log.Error().Msg("invalid configuration: --upstream-command and --upstream-url exclude each other (one upstream per mandate-mcp)")
		return 2
	}
	rules, err := mcpguard.LoadRules(c.rules)
	if err != nil {
		log.Error().Err(err).Msg("invalid rules")
		return 2
	}
	gcfg := mcpguard.Config{Rules: rules, UpstreamCommand: strings.Fields(c.upstreamCommand), UpstreamURL: c.upstreamURL,
		UpstreamStderr: os.Stderr, CallTimeout: c.callTimeout, UpstreamTimeout: c.upstreamTimeout, MaxResultBytes: c.maxResultBytes, SessionTimeout: c.sessionTimeout, Logger: &log}
	if err := gcfg.Validate(); err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}
	brokers, kopts, err := c.kafka.DaemonOpts(log)
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cl, ok := connectClient(ctx, client.Config{Brokers: brokers, KafkaOpts: kopts, ProposalsTopic: c.proposalsTopic,
		GrantsTopic: c.grantsTopic, DecisionsTopic: c.decisionsTopic, DeliveryTimeout: c.callTimeout, LoserWait: c.loserWait, Logger: &log}, log)
	if !ok {
		return 0
	}
	defer cl.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	g, err := mcpguard.New(sctx, gcfg, cl, reg)
	cancel()
	if err != nil {
		log.Error().Err(err).Msg("cannot start")
		return 1
	}
	defer g.Close()

	var opsServer *http.Server
	if c.opsAddr != "" {
		ops := cli.Ops(reg, func(ctx context.Context) (string, error) { return "", g.Ready(ctx) })
		ln, err := net.Listen("tcp", c.opsAddr)
		if err != nil {
			log.Error().Err(err).Str("addr", c.opsAddr).Msg("cannot listen")
			return 1
		}
		opsServer = &http.Server{Handler: ops, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
		go func() {
			if err := opsServer.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error().Err(err).Msg("ops server failed")
			}
		}()
		log.Info().Str("ops", ln.Addr().String()).Msg("ops server running")
	}
	defer func() {
		if opsServer != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = opsServer.Shutdown(sctx)
		}
	}()

	if c.httpAddr == "" {
		log.Info().Msg("mandate-mcp serving MCP on stdio")
		if err := g.RunStdio(ctx); err != nil && ctx.Err() == nil {
			log.Error().Err(err).Msg("stdio session ended")
			return 1
		}
		log.Info().Msg("stopped")
		return 0
	}
	ln, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		log.Error().Err(err).Str("addr", c.httpAddr).Msg("cannot listen")
		return 1
	}
	hs := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server failed")
		}
	}()
	log.Info().Str("http", ln.Addr().String()).Msg("mandate-mcp serving MCP over streamable HTTP")
	<-ctx.Done()
	stop()
	log.Info().Dur("bound", c.shutdownTimeout).Msg("shutting down: finishing calls in flight")
	shctx, cancel2 := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel2()
	if err := hs.Shutdown(shctx); err != nil {
		log.Error().Err(err).Msg("shutdown did not complete cleanly")
		return 1
	}
	log.Info().Msg("stopped")
	return 0
}

// connectClient retries while Kafka or the decisions topic are not there
// yet; a signal abandons it.
func connectClient(ctx context.Context, cfg client.Config, log zerolog.Logger) (*client.Client, bool) {
	b := backoff.New(time.Second, 15*time.Second)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cl, err := client.New(cctx, cfg)
		cancel()
		if err == nil {
			return cl, true
		}
		log.Error().Err(err).Int("attempt", attempt).Dur("retry_in", b.Current()).Msg("cannot reach Kafka yet; retrying")
		if !b.Wait(ctx) {
			return nil, false
		}
	}
}
