package mcpguard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
)

// upstream is the session with the upstream MCP server, opened again when
// it was lost.
type upstream struct {
	cfg    Config
	log    zerolog.Logger
	client *mcp.Client

	mu      sync.Mutex
	session *mcp.ClientSession
}

func newUpstream(cfg Config, log zerolog.Logger) *upstream {
	return &upstream{cfg: cfg, log: log,
		client: mcp.NewClient(&mcp.Implementation{Name: cfg.Name, Version: "1"}, nil)}
}

func (u *upstream) describe() string {
	if u.cfg.UpstreamURL != "" {
		return u.cfg.UpstreamURL
	}
	return fmt.Sprintf("%q", u.cfg.UpstreamCommand)
}

func (u *upstream) transport() mcp.Transport {
	if u.cfg.UpstreamURL != "" {
		return &mcp.StreamableClientTransport{Endpoint: u.cfg.UpstreamURL, MaxRetries: -1, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{}}
	}
	cmd := exec.Command(u.cfg.UpstreamCommand[0], u.cfg.UpstreamCommand[1:]...)
	cmd.Stderr = u.cfg.UpstreamStderr
	return &mcp.CommandTransport{Command: cmd}
}

// get returns the session, connecting when there is none.
func (u *upstream) get(ctx context.Context) (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.session != nil {
		return u.session, nil
	}
	s, err := u.client.Connect(ctx, u.transport(), nil)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: connect: %w", u.describe(), err)
	}
	u.session = s
	u.log.Info().Str("upstream", u.describe()).Msg("upstream session opened")
	go func() {
		_ = s.Wait()
		u.drop(s)
	}()
	return s, nil
}

// drop forgets a session that failed, so the next call connects again.
func (u *upstream) drop(s *mcp.ClientSession) {
	u.mu.Lock()
	mine := u.session == s
	if mine {
		u.session = nil
	}
	u.mu.Unlock()
	if mine {
		go func() { _ = s.Close() }()
		u.log.Warn().Str("upstream", u.describe()).Msg("upstream session lost; the next call connects again")
	}
}

// ready checks that the upstream answers a ping, connecting when there is
// no session: called before a proposal, so that an upstream that cannot be
// reached costs no authority, and by /readyz. An upstream that answers the
// ping with an error (a JSON-RPC error: it refuses pings, or this one) has
// answered: it is reachable. A ping that fails never closes the session:
// the calls forwarded on it are still running (a readiness probe must not
// kill an effect); only a session that is gone already (its connection
// closed, the server forgot it) is replaced, once.
func (u *upstream) ready(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, u.cfg.PingTimeout)
		s, err := u.get(pctx)
		if err == nil {
			err = ping(pctx, s)
			if err != nil && gone(err) {
				u.drop(s)
			}
			if err != nil {
				err = fmt.Errorf("upstream %s: ping: %w", u.describe(), err)
			}
		}
		cancel()
		if err == nil || attempt == 1 || ctx.Err() != nil || !gone(err) {
			return err
		}
	}
}

// ping sends an MCP ping and reports whether the upstream answered. From
// protocol 2026-07-28 on every request carries the per-request _meta
// envelope (SEP-2575): the Go SDK adds it to its calls but not to Ping, so
// it is added here. An answer that is a JSON-RPC error is still an answer:
// the Python SDK 2.x refuses a ping without the envelope and answers one
// with it "Method not found" (its MCPServer registers no ping handler).
func ping(ctx context.Context, s *mcp.ClientSession) error {
	var params *mcp.PingParams
	if ir := s.InitializeResult(); ir != nil && ir.ProtocolVersion >= protocolEnvelope {
		params = &mcp.PingParams{Meta: mcp.Meta{
			mcp.MetaKeyProtocolVersion:    ir.ProtocolVersion,
			mcp.MetaKeyClientCapabilities: map[string]any{},
		}}
	}
	err := s.Ping(ctx, params)
	if answered(err) != nil {
		return nil
	}
	return err
}

// answered returns the JSON-RPC error the upstream answered with, if err
// carries one: not the SDK's own codes for a request that never got an
// answer (rejected by the transport: connection refused, a 5xx; the client
// or the server closing).
func answered(err error) *jsonrpc.Error {
	var found *jsonrpc.Error
	var walk func(error)
	walk = func(e error) {
		if e == nil || found != nil {
			return
		}
		if je, ok := e.(*jsonrpc.Error); ok {
			switch je.Code {
			case codeRejected, codeClientClosing, codeServerClosing:
			default:
				found = je
				return
			}
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return found
}

// The go-sdk's own JSON-RPC codes (internal/jsonrpc2) for requests that
// were not answered by the peer.
const (
	codeClientClosing = -32003
	codeServerClosing = -32004
	codeRejected      = -32005
)

// protocolEnvelope is the first MCP protocol version whose requests carry
// the per-request _meta envelope.
const protocolEnvelope = "2026-07-28"

// gone reports whether err says the session itself is lost: its
// connection closed, or the server no longer knows it.
func gone(err error) bool {
	return errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing)
}

// tools lists every tool of the upstream, following cursors.
func (u *upstream) tools(ctx context.Context) ([]*mcp.Tool, error) {
	s, err := u.get(ctx)
	if err != nil {
		return nil, err
	}
	var out []*mcp.Tool
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("upstream %s: tools/list: %w", u.describe(), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// call forwards one tools/call.
func (u *upstream) call(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	s, err := u.get(ctx)
	if err != nil {
		return nil, &notSentError{err}
	}
	res, err := s.CallTool(ctx, params)
	if err != nil && gone(err) {
		u.drop(s)
	}
	return res, err
}

// notSentError is an upstream failure before the request left: the tool
// certainly did not run.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// notExecuted reports whether an error of call proves the tool did not
// run: the request was never sent (no session, connection refused), or
// the upstream refused it before running any tool (a JSON-RPC error about
// the request itself). Anything else — a timeout, a connection lost after
// sending, an internal error — leaves the outcome unknown.
func notExecuted(err error) bool {
	var ns *notSentError
	if errors.As(err, &ns) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	if je := answered(err); je != nil {
		switch je.Code {
		case jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
			return true
		}
	}
	return false
}

func (u *upstream) close() {
	u.mu.Lock()
	s := u.session
	u.session = nil
	u.mu.Unlock()
	if s != nil {
		done := make(chan struct{})
		go func() { _ = s.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
}
