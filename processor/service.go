package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
)

// ServiceConfig configures a whole mandated instance: storage, processor and
// relay, as cmd/mandated runs them.
type ServiceConfig struct {
	// Sink configures storage; with Shards, every shard's connections
	// (Sink.DatabaseURL is then ignored).
	Sink sink.Config
	// Shards maps partitions to databases. Defaults to every partition in
	// Sink.DatabaseURL.
	Shards    *shardmap.Map
	Processor Config
	Relay     outbox.Config
	// Registerer receives every metric. Defaults to none.
	Registerer prometheus.Registerer
}

// Service is one running mandated instance.
type Service struct {
	// Sink is the control shard's storage (the only one without Shards).
	Sink      *sink.Sink
	Shards    *sink.Shards
	Processor *Processor
	Relay     *outbox.Relay
	Metrics   *Metrics
	log       zerolog.Logger
}

// StartService opens storage (applying migrations), starts the relay and
// the processor, and returns once the processor has joined its group. A
// start that fails unregisters the metrics it registered, so the caller
// can try again with the same Registerer.
func StartService(ctx context.Context, cfg ServiceConfig, log zerolog.Logger) (svc *Service, err error) {
	if cfg.Registerer != nil {
		reg := &undoRegisterer{Registerer: cfg.Registerer}
		cfg.Registerer = reg
		defer func() {
			if err != nil {
				reg.undo()
			}
		}()
	}
	if cfg.Sink.Instance == "" {
		cfg.Sink.Instance = cfg.Processor.WithDefaults().Owner
	}
	m := cfg.Shards
	if m == nil {
		m = shardmap.Single(cfg.Sink.DatabaseURL)
	}
	s, err := sink.OpenShards(ctx, cfg.Sink, m, log.With().Str("component", "sink").Logger())
	if err != nil {
		return nil, err
	}
	rcfg := cfg.Relay
	if len(rcfg.Brokers) == 0 {
		rcfg.Brokers = cfg.Processor.Brokers
	}
	if rcfg.KafkaOpts == nil {
		rcfg.KafkaOpts = cfg.Processor.KafkaOpts
	}
	if rcfg.ClientHooks == nil {
		rcfg.ClientHooks = cfg.Processor.ClientHooks
	}
	pcfg := cfg.Processor.WithDefaults()
	if rcfg.DecisionsTopic == "" {
		rcfg.DecisionsTopic = pcfg.DecisionsTopic
	}
	if rcfg.DeadLetterTopic == "" {
		rcfg.DeadLetterTopic = pcfg.DeadLetterTopic
	}
	rcfg.ProposalsTopic, rcfg.GrantsTopic = pcfg.ProposalsTopic, pcfg.GrantsTopic
	if rcfg.DecisionKeys == nil {
		rcfg.DecisionKeys = sink.NewDecisionKeyCache(s.Control().Pool())
	}
	if rcfg.DecisionsTopic != pcfg.DecisionsTopic || rcfg.DeadLetterTopic != pcfg.DeadLetterTopic {
		s.Close()
		return nil, errors.New("service: the relay and the processor must name the same decisions and dead-letter topics")
	}
	relay, err := outbox.NewSharded(rcfg, relayShards{s}, log, outbox.NewMetrics(cfg.Registerer))
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := s.Control().RegisterSigner(ctx, relay.Signer(), pcfg.Owner); err != nil {
		s.Close()
		return nil, err
	}
	if err := relay.Start(ctx); err != nil {
		s.Close()
		return nil, err
	}
	pcfg.Listener = relay
	metrics := NewMetrics(cfg.Registerer)
	p, err := NewSharded(pcfg, s, log, metrics)
	if err != nil {
		_ = relay.Stop(ctx)
		s.Close()
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		_ = relay.Stop(ctx)
		s.Close()
		return nil, fmt.Errorf("service: %w", err)
	}
	return &Service{Sink: s.Control(), Shards: s, Processor: p, Relay: relay, Metrics: metrics, log: log}, nil
}

// relayShards routes the relay's partitions as the shard map last read
// says.
type relayShards struct{ s *sink.Shards }

var _ outbox.Shards = relayShards{}

func (r relayShards) For(p int32) outbox.Shard { return relayShard(r.s.For(p)) }

func (r relayShards) All() []outbox.Shard {
	var out []outbox.Shard
	for _, one := range r.s.All() {
		out = append(out, relayShard(one))
	}
	return out
}

func relayShard(s *sink.Sink) outbox.Shard { return outbox.Shard{Name: s.Shard().Name, Pool: s.Pool()} }

// Stop stops fetching, finishes the batches in flight, drains the relay
// (bounded by ctx) and closes storage.
func (svc *Service) Stop(ctx context.Context) error {
	start := time.Now()
	perr := svc.Processor.Stop(ctx)
	stopped := time.Now()
	rerr := svc.Relay.Stop(ctx)
	drained := time.Now()
	svc.Shards.Close()
	svc.log.Info().Dur("processor", stopped.Sub(start)).Dur("relay", drained.Sub(stopped)).Dur("storage", time.Since(drained)).
		Msg("service stopped")
	return errors.Join(perr, rerr)
}

// Ready reports whether the instance is ready: the processor's Ready, and
// the relay's (what its tail reads found that is not mandated's own chain:
// records another producer wrote, a chain past PostgreSQL's head).
func (svc *Service) Ready(ctx context.Context) error {
	return errors.Join(svc.Processor.Ready(ctx), svc.Relay.Ready(ctx))
}

// undoRegisterer remembers what it registered, to unregister it all.
type undoRegisterer struct {
	prometheus.Registerer
	registered []prometheus.Collector
}

func (u *undoRegisterer) Register(c prometheus.Collector) error {
	if err := u.Registerer.Register(c); err != nil {
		return err
	}
	u.registered = append(u.registered, c)
	return nil
}

func (u *undoRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := u.Register(c); err != nil {
			panic(err)
		}
	}
}

func (u *undoRegisterer) undo() {
	for _, c := range u.registered {
		u.Registerer.Unregister(c)
	}
	u.registered = nil
}

// The relay takes each commit's rows in memory.
var _ RowsListener = (*outbox.Relay)(nil)
