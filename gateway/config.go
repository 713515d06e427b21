package gateway

import (
	"cmp"
	"errors"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/wire"
)

// Defaults of Config.
const (
	DefaultWaitDefault       = 5 * time.Second
	MaxWaitDefault           = 30 * time.Second
	MaxBodyBytesDefault      = wire.MaxRecordBytesDefault
	MaxRecordBytesDefault    = wire.MaxRecordBytesDefault
	ProduceTimeoutDefault    = 2 * time.Second
	MaxInFlightPerOrgDefault = 256
	ReadHeaderTimeoutDefault = 5 * time.Second
	ReadTimeoutDefault       = 15 * time.Second
	IdleTimeoutDefault       = 60 * time.Second
	MaxHeaderBytesDefault    = 16 << 10
	QueryTimeoutDefault      = 5 * time.Second
	// DBMaxConnsDefault is mandate-gateway's PostgreSQL pool size per
	// shard (mandated's is sink.MaxConnsDefault).
	DBMaxConnsDefault int32 = 8
)

// Config configures a Server.
type Config struct {
	// DefaultWait is how long a command waits for its decision without a
	// Prefer: wait header. Defaults to DefaultWaitDefault.
	DefaultWait time.Duration
	// MaxWait bounds Prefer: wait. Defaults to MaxWaitDefault.
	MaxWait time.Duration
	// ProduceTimeout is the least time a command's produce may take when
	// its wait is shorter (Prefer: wait=0 still gets this long for Kafka to
	// acknowledge the record); the produce and the wait for the decision
	// share one deadline otherwise. A produce not acknowledged in time is
	// answered 503 with Retry-After. Defaults to ProduceTimeoutDefault.
	ProduceTimeout time.Duration
	// MaxBodyBytes bounds a request body (413 beyond). Defaults to
	// MaxBodyBytesDefault, the processor's record limit.
	MaxBodyBytes int64
	// MaxRecordBytes is the processors' record limit (their
	// --max-record-bytes): the record the gateway builds around a body is
	// decoded with it. Defaults to MaxRecordBytesDefault.
	MaxRecordBytes int
	// MaxInFlightPerOrg bounds an org's commands waiting at once (429
	// beyond). Defaults to MaxInFlightPerOrgDefault.
	MaxInFlightPerOrg int
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout are the http.Server's.
	// They default to ReadHeaderTimeoutDefault, ReadTimeoutDefault and
	// IdleTimeoutDefault; the write timeout is MaxWait + ReadTimeout.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
	// MaxHeaderBytes bounds request headers. Defaults to MaxHeaderBytesDefault.
	MaxHeaderBytes int
	// QueryTimeout bounds each PostgreSQL query. Defaults to QueryTimeoutDefault.
	QueryTimeout time.Duration
	// Logger receives one event per failed request. Defaults to zerolog.Nop().
	Logger *zerolog.Logger
	// TracerProvider traces each API request (otelhttp: the caller's W3C
	// traceparent is its parent) and gives the request duration histogram
	// its exemplars; the produce's span and the record's traceparent header
	// come from the client's Kafka hooks (tracing.KafkaHooks). Defaults to
	// nil: tracing off, the handler unwrapped.
	TracerProvider trace.TracerProvider
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.DefaultWait = cmp.Or(c.DefaultWait, DefaultWaitDefault)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, MaxBodyBytesDefault)
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, MaxRecordBytesDefault)
	c.ProduceTimeout = cmp.Or(c.ProduceTimeout, ProduceTimeoutDefault)
	c.MaxInFlightPerOrg = cmp.Or(c.MaxInFlightPerOrg, MaxInFlightPerOrgDefault)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, ReadHeaderTimeoutDefault)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, ReadTimeoutDefault)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, IdleTimeoutDefault)
	c.MaxHeaderBytes = cmp.Or(c.MaxHeaderBytes, MaxHeaderBytesDefault)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, QueryTimeoutDefault)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.DefaultWait < 0 || c.MaxWait < 0:
		return errors.New("gateway: DefaultWait and MaxWait must not be negative")
	case c.DefaultWait > c.MaxWait:
		return errors.New("gateway: DefaultWait must not exceed MaxWait")
	case c.MaxBodyBytes < 0 || c.MaxRecordBytes < 0:
		return errors.New("gateway: MaxBodyBytes and MaxRecordBytes must not be negative")
	case c.ProduceTimeout < 0:
		return errors.New("gateway: ProduceTimeout must not be negative")
	case c.MaxInFlightPerOrg < 0:
		return errors.New("gateway: MaxInFlightPerOrg must not be negative")
	}
	return nil
}
