package mcpguard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/mandated/mandated/client"
)

// Meta keys mandate-mcp writes: on the forwarded call (the authorization id,
// the upstream's idempotency key if it reads one) and on its answers.
const (
	MetaAuthorizationID = "io.mandated/authorization_id"
	MetaDecisionID      = "io.mandated/decision_id"
	MetaReason          = "io.mandated/reason"
	MetaOutcome         = "io.mandated/outcome"
	MetaGuarded         = "io.mandated/guarded"
	// On an in-progress answer: the executor whose begin won, since when it
	// executes, from when an operator can settle it (RFC 3339, UTC).
	MetaExecutor       = "io.mandated/executor"
	MetaSince          = "io.mandated/since"
	MetaReconcilableAt = "io.mandated/reconcilable_at"
)

// Guard is the MCP server in front of one upstream.
type Guard struct {
	cfg    Config
	log    zerolog.Logger
	cl     *client.Client
	up     *upstream
	m      *metrics
	server *mcp.Server
	tools  map[string]*guardedTool
}

type guardedTool struct {
	name   string
	rule   *Rule
	schema *jsonschema.Schema
	// output is the tool's output schema, nil when it declares none: a
	// client then requires structured content matching it in every answer
	// that is not an error.
	output *jsonschema.Schema
}

// checkOutput says why v is not structured content a client accepts for
// the tool ("" when it is).
func (gt *guardedTool) checkOutput(v any) string {
	if v == nil {
		return "no structured content was recorded and the tool declares an output schema"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "the structured content does not encode"
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return "the structured content does not decode"
	}
	if err := gt.output.Validate(doc); err != nil {
		return fmt.Sprintf("the result recorded does not match the tool's output schema (%v)", err)
	}
	return ""
}

// New connects to the upstream, lists its tools, checks the rules against
// their schemas and builds the server. It fails when the upstream cannot
// be reached, or a rule names a tool or an argument the upstream does not
// have.
func New(ctx context.Context, cfg Config, cl *client.Client, reg prometheus.Registerer) (*Guard, error) {
	cfg.Rules = cfg.Rules.clone() // validation fills in defaults: never in the caller's rules, which other guards may share
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	log := cfg.Logger.With().Str("component", "mcpguard").Logger()
	g := &Guard{cfg: cfg, log: log, cl: cl, up: newUpstream(cfg, log), m: newMetrics(reg), tools: map[string]*guardedTool{}}
	tools, err := g.up.tools(ctx)
	if err != nil {
		g.up.close()
		return nil, err
	}
	byName := map[string]*mcp.Tool{}
	for _, t := range tools {
		byName[t.Name] = t
	}
	for _, name := range cfg.Rules.names() {
		t, ok := byName[name]
		if !ok {
			g.up.close()
			return nil, fmt.Errorf("rules: tools.%s: the upstream %s has no tool %q (it has: %s)", name, g.up.describe(), name, strings.Join(sortedNames(byName), ", "))
		}
		gt, err := guard(t, cfg.Rules.Tools[name])
		if err != nil {
			g.up.close()
			return nil, err
		}
		g.tools[name] = gt
	}
	g.server = mcp.NewServer(&mcp.Implementation{Name: cfg.Name, Version: "1"}, nil)
	for _, t := range tools {
		if err := g.add(t); err != nil {
			g.up.close()
			return nil, err
		}
	}
	log.Info().Str("upstream", g.up.describe()).Int("tools", len(tools)).Strs("guarded", cfg.Rules.names()).Msg("mandate-mcp ready")
	return g, nil
}

func sortedNames(m map[string]*mcp.Tool) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// guard compiles a guarded tool's input (and output) schema and checks
// that every argument its rule reads is a property of it.
func guard(t *mcp.Tool, rule *Rule) (*guardedTool, error) {
	at := "rules: tools." + t.Name
	raw, err := json.Marshal(t.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("%s: the upstream's input schema does not encode: %w", at, err)
	}
	sch, err := compileSchema(t.Name, "input", raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	var output *jsonschema.Schema
	if t.OutputSchema != nil {
		b, err := json.Marshal(t.OutputSchema)
		if err != nil {
			return nil, fmt.Errorf("%s: the upstream's output schema does not encode: %w", at, err)
		}
		if output, err = compileSchema(t.Name, "output", b); err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
	}
	var props struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	_ = json.Unmarshal(raw, &props)
	for _, a := range rule.arguments() {
		if _, ok := props.Properties[a]; !ok {
			return nil, fmt.Errorf("%s: the rule reads the argument %q, which is not a property of the tool's input schema", at, a)
		}
	}
	return &guardedTool{name: t.Name, rule: rule, schema: sch, output: output}, nil
}

func compileSchema(tool, kind string, raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("the upstream's %s schema: %w", kind, err)
	}
	c := jsonschema.NewCompiler()
	url := "mcp:///tools/" + tool + "/" + kind + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("the upstream's %s schema: %w", kind, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("the upstream's %s schema does not compile: %w", kind, err)
	}
	return sch, nil
}

// add registers one upstream tool, guarded or passed through.
func (g *Guard) add(t *mcp.Tool) (err error) {
	defer func() {
		if r := recover(); r != nil { // the SDK panics on a tool it cannot serve
			err = fmt.Errorf("upstream tool %q cannot be served: %v", t.Name, r)
		}
	}()
	cp := *t
	if gt, ok := g.tools[t.Name]; ok {
		meta := mcp.Meta{}
		for k, v := range t.Meta {
			meta[k] = v
		}
		meta[MetaGuarded] = true
		cp.Meta = meta
		g.server.AddTool(&cp, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return g.callGuarded(ctx, gt, req)
		})
		return nil
	}
	name := t.Name
	g.server.AddTool(&cp, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		start := time.Now()
		res, err := g.up.call(ctx, &mcp.CallToolParams{Meta: req.Params.Meta, Name: name, Arguments: arguments(req.Params.Arguments)})
		g.observeUpstream(name, start, res, err)
		g.m.calls.WithLabelValues(name, OutcomePassthrough).Inc()
		return res, err
	})
	return nil
}

func arguments(raw json.RawMessage) any {
	if len(raw) == 0 {
		return nil
	}
	return raw
}

func (g *Guard) observeUpstream(tool string, start time.Time, res *mcp.CallToolResult, err error) {
	result := "ok"
	switch {
	case err != nil:
		result = "error"
	case res != nil && res.IsError:
		result = "tool_error"
	}
	g.m.upstream.WithLabelValues(tool, result).Observe(time.Since(start).Seconds())
}

// Server is the MCP server, for any transport of the SDK.
func (g *Guard) Server() *mcp.Server { return g.server }

// Handler serves the MCP server over streamable HTTP.
func (g *Guard) Handler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server },
		&mcp.StreamableHTTPOptions{SessionTimeout: g.cfg.SessionTimeout})
}

// RunStdio serves one client over stdin and stdout until it disconnects
// or ctx ends.
func (g *Guard) RunStdio(ctx context.Context) error {
	return g.server.Run(ctx, &mcp.StdioTransport{})
}

// Ready reports whether the upstream answers and Kafka is reachable.
func (g *Guard) Ready(ctx context.Context) error {
	if err := g.up.ready(ctx); err != nil {
		return err
	}
	return g.cl.Ping(ctx)
}

// Close ends the upstream session (and stops a stdio upstream).
func (g *Guard) Close() { g.up.close() }

// Tools returns the names of the guarded tools.
func (g *Guard) Tools() []string { return g.cfg.Rules.names() }
