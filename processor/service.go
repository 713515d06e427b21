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
)

// ServiceConfig configures a whole mandated instance: storage, processor and
// relay, as cmd/mandated runs them.
type ServiceConfig struct {
	Sink      sink.Config
	Processor Config
	Relay     outbox.Config
	// Registerer receives every metric. Defaults to none.
	Registerer prometheus.Registerer
}

// Service is one running mandated instance.
type Service struct {
	Sink      *sink.Sink
	Processor *Processor
	Relay     *outbox.Relay
	Metrics   *Metrics
	log       zerolog.Logger
}

// StartService opens storage (applying migrations), starts the relay and
// the processor, and returns once the processor has joined its group.
func StartService(ctx context.Context, cfg ServiceConfig, log zerolog.Logger) (*Service, error) {
	if cfg.Sink.Instance == "" {
		cfg.Sink.Instance = cfg.Processor.WithDefaults().Owner
	}
	s, err := sink.Open(ctx, cfg.Sink, log.With().Str("component", "sink").Logger())
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
	if rcfg.DecisionsTopic != pcfg.DecisionsTopic || rcfg.DeadLetterTopic != pcfg.DeadLetterTopic {
		s.Close()
		return nil, errors.New("service: the relay and the processor must name the same decisions and dead-letter topics")
	}
	relay, err := outbox.New(rcfg, s.Pool(), log, outbox.NewMetrics(cfg.Registerer))
	if err != nil {
		s.Close()
		return nil, err
	}
	pcfg.Listener = relay
	m := NewMetrics(cfg.Registerer)
	p, err := New(pcfg, s, log, m)
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
	return &Service{Sink: s, Processor: p, Relay: relay, Metrics: m, log: log}, nil
}

// Stop stops fetching, finishes the batches in flight, drains the relay
// (bounded by ctx) and closes storage.
func (svc *Service) Stop(ctx context.Context) error {
	start := time.Now()
	perr := svc.Processor.Stop(ctx)
	stopped := time.Now()
	rerr := svc.Relay.Stop(ctx)
	drained := time.Now()
	svc.Sink.Close()
	svc.log.Info().Dur("processor", stopped.Sub(start)).Dur("relay", drained.Sub(stopped)).Dur("storage", time.Since(drained)).
		Msg("service stopped")
	return errors.Join(perr, rerr)
}
