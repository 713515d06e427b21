package mcpguard

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/rs/zerolog"

	"github.com/mandated/mandated/wire"
)

// Defaults of Config.
const (
	NameDefault            = "mandate-mcp"
	CallTimeoutDefault     = 2 * time.Minute
	UpstreamTimeoutDefault = 30 * time.Second
	PingTimeoutDefault     = 3 * time.Second
	MaxResultBytesDefault  = wire.MaxResultBytes
	SessionTimeoutDefault  = 10 * time.Minute
)

// FailpointAfterForward is the failpoint between the upstream's answer and
// the commit (internal/failpoint): a crash there leaves the effect done and
// the authorization executing, for the execution timeout to put in doubt.
const FailpointAfterForward = "mcp_after_forward_before_commit"

// Config configures a Guard.
type Config struct {
	// Rules are the guarded tools (LoadRules). Required.
	Rules *Rules
	// UpstreamCommand runs the upstream MCP server over stdio: the program
	// and its arguments. Exactly one of UpstreamCommand and UpstreamURL.
	UpstreamCommand []string
	// UpstreamStderr receives a stdio upstream's standard error. Defaults
	// to discarding it.
	UpstreamStderr io.Writer
	// UpstreamURL is the upstream's streamable-HTTP endpoint.
	UpstreamURL string
	// Name is the server name announced to clients. Defaults to
	// NameDefault.
	Name string
	// CallTimeout bounds one guarded call: waiting for the decisions, the
	// upstream, and for a concurrent winner's result. Defaults to
	// CallTimeoutDefault.
	CallTimeout time.Duration
	// UpstreamTimeout bounds the forwarded call; past it the outcome is
	// unknown (in doubt). Keep it below the mandates' execution timeout.
	// Defaults to UpstreamTimeoutDefault.
	UpstreamTimeout time.Duration
	// PingTimeout bounds the upstream ping before a proposal. Defaults to
	// PingTimeoutDefault.
	PingTimeout time.Duration
	// MaxResultBytes bounds the recorded result (the upstream's
	// CallToolResult as compact JSON). Above it the record holds the
	// result's size, SHA-256 and a text prefix instead; the winner still
	// returns the full result, repeats get the stub. At most
	// wire.MaxResultBytes. Defaults to MaxResultBytesDefault.
	MaxResultBytes int
	// SessionTimeout closes an agent's streamable-HTTP session idle this
	// long (an agent that went away without ending it). Defaults to
	// SessionTimeoutDefault.
	SessionTimeout time.Duration
	// Logger receives the guard's events. Defaults to zerolog.Nop().
	Logger *zerolog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Name = cmp.Or(c.Name, NameDefault)
	c.CallTimeout = cmp.Or(c.CallTimeout, CallTimeoutDefault)
	c.UpstreamTimeout = cmp.Or(c.UpstreamTimeout, UpstreamTimeoutDefault)
	c.PingTimeout = cmp.Or(c.PingTimeout, PingTimeoutDefault)
	c.MaxResultBytes = cmp.Or(c.MaxResultBytes, MaxResultBytesDefault)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, SessionTimeoutDefault)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Rules == nil:
		return errors.New("mcpguard: Config.Rules is required")
	case len(c.UpstreamCommand) == 0 && c.UpstreamURL == "":
		return errors.New("mcpguard: Config.UpstreamCommand or Config.UpstreamURL is required")
	case len(c.UpstreamCommand) > 0 && c.UpstreamURL != "":
		return errors.New("mcpguard: Config.UpstreamCommand and Config.UpstreamURL exclude each other")
	case c.CallTimeout < 0:
		return errors.New("mcpguard: Config.CallTimeout must not be negative")
	case c.UpstreamTimeout < 0:
		return errors.New("mcpguard: Config.UpstreamTimeout must not be negative")
	case c.SessionTimeout < 0:
		return errors.New("mcpguard: Config.SessionTimeout must not be negative")
	case c.PingTimeout < 0:
		return errors.New("mcpguard: Config.PingTimeout must not be negative")
	case c.MaxResultBytes < 0 || c.MaxResultBytes > wire.MaxResultBytes:
		return fmt.Errorf("mcpguard: Config.MaxResultBytes must be between 0 and %d (wire.MaxResultBytes)", wire.MaxResultBytes)
	}
	if c.UpstreamURL != "" {
		u, err := url.Parse(c.UpstreamURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("mcpguard: Config.UpstreamURL %q is not an http(s) URL", c.UpstreamURL)
		}
	}
	return c.Rules.Validate()
}
