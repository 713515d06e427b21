package mcpguard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// rulesYAML guards the upstream's refund tool: the mandate is the case,
// the target the order, the amount the argument, the intent the caller's
// _meta run id and step. reference is what a restored agent regenerates.
const rulesYAML = `
tools:
  refund:
    org: acme
    mandate_id: "case-{case_id}"
    operation: payment.refund
    amount: {minor_units: "{amount_cents}", currency: EUR}
    target: "{order_id}"
    intent: {from: meta}
`

// bundle is one test's world: a real mandated pipeline (Kafka, PostgreSQL,
// an in-process processor), a ledger table the upstream writes without
// deduplicating, the upstream MCP server (Go SDK, streamable HTTP), and a
// Go client for mandate-mcp.
type bundle struct {
	h      *harness.Harness
	cl     *client.Client
	ledger *pgxpool.Pool
	up     *upstreamServer
	rules  *mcpguard.Rules
}

func setup(t *testing.T) *bundle {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: 3})
	h.Start("a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE ledger (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL,
		reference text NOT NULL, authorization_id text, at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	log := h.Log
	cl, err := client.New(ctx, client.Config{Brokers: h.Brokers, ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants,
		DecisionsTopic: h.Spec.Decisions, Logger: &log})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	rules, err := mcpguard.ParseRules([]byte(rulesYAML))
	require.NoError(t, err)
	return &bundle{h: h, cl: cl, ledger: pool, up: startUpstream(t, pool), rules: rules}
}

// guard starts a mandate-mcp (package mcpguard, in process) in front of
// upstreamURL, served over streamable HTTP; it returns its URL.
func (b *bundle) guard(t *testing.T, upstreamURL string, mods ...func(*mcpguard.Config)) (string, *prometheus.Registry) {
	t.Helper()
	_, url, reg := b.start(t, append([]func(*mcpguard.Config){func(c *mcpguard.Config) { c.UpstreamURL = upstreamURL }}, mods...)...)
	return url, reg
}

// start is guard for any upstream (the mods name it), returning the Guard
// too (its Ready is what /readyz answers).
func (b *bundle) start(t *testing.T, mods ...func(*mcpguard.Config)) (*mcpguard.Guard, string, *prometheus.Registry) {
	t.Helper()
	log := b.h.Log.With().Str("component", "mandate-mcp").Logger()
	cfg := mcpguard.Config{Rules: b.rules, Logger: &log, CallTimeout: 45 * time.Second}
	for _, m := range mods {
		m(&cfg)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := mcpguard.New(ctx, cfg, b.cl, reg)
	require.NoError(t, err)
	t.Cleanup(g.Close)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return g, srv.URL, reg
}

// grant creates mandate acme/<id>: uses refunds of at most 200 EUR.
func (b *bundle) grant(t *testing.T, id string, uses, executionTimeoutSeconds int64) {
	t.Helper()
	d := b.h.SendAwait(map[string]any{"type": "grant", "org": "acme", "mandate_id": id, "uses": uses,
		"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"payment.refund"},
		"execution_timeout_seconds": executionTimeoutSeconds})
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%+v", d)
}

// effects counts the ledger rows of an order: the truth of how often the
// refund happened.
func (b *bundle) effects(t *testing.T, orderID string) int {
	t.Helper()
	var n int
	require.NoError(t, b.ledger.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE order_id = $1`, orderID).Scan(&n))
	return n
}

// proposed is how many records the proposals topic holds: a call that
// must propose nothing leaves it unchanged.
func (b *bundle) proposed(t *testing.T) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := b.cl.EndOffsets(ctx, b.h.Spec.Proposals)
	require.NoError(t, err)
	var n int64
	for _, o := range ends[b.h.Spec.Proposals] {
		n += o
	}
	return n
}

// agent connects a Go SDK MCP client (the agent) over streamable HTTP.
func agent(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func refundArgs(caseID, orderID string, cents int64, reference string) map[string]any {
	return map[string]any{"case_id": caseID, "order_id": orderID, "amount_cents": cents, "reference": reference}
}

func runMeta(run, step string) mcp.Meta { return mcp.Meta{"run_id": run, "step": step} }

func callTool(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args, Meta: meta})
	require.NoError(t, err)
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// body is a result as the agent's model sees it: content, structured
// content, isError (mandate-mcp's _meta says executed or replayed).
func body(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	cp := *res
	cp.Meta = nil
	b, err := json.Marshal(&cp)
	require.NoError(t, err)
	return string(b)
}

// upstreamServer is the MCP server behind mandate-mcp: a Go SDK server
// whose refund tool inserts a ledger row every time it runs.
type upstreamServer struct {
	URL    string
	srv    *httptest.Server
	calls  atomic.Int64 // refund calls that reached the tool
	quotes atomic.Int64 // quote calls that reached the tool
	delay  atomic.Int64 // nanoseconds the refund takes after its insert
}

type refundIn struct {
	CaseID      string `json:"case_id" jsonschema:"the support case"`
	OrderID     string `json:"order_id" jsonschema:"the order to refund"`
	AmountCents int64  `json:"amount_cents" jsonschema:"the amount in cents"`
	Reference   string `json:"reference" jsonschema:"the caller's reference (regenerated on restore)"`
	Pad         int    `json:"pad,omitempty" jsonschema:"bytes of padding in the answer's structured content"`
	PadText     int    `json:"pad_text,omitempty" jsonschema:"bytes of padding in the answer's text"`
}

type refundOut struct {
	LedgerID    int64  `json:"ledger_id"`
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Note        string `json:"note,omitempty"`
}

type quoteIn struct {
	CaseID  string `json:"case_id"`
	OrderID string `json:"order_id"`
}

type quoteOut struct {
	OrderID    string `json:"order_id"`
	Quote      int64  `json:"quote"` // the how-manieth quote of this server
	PriceCents int64  `json:"price_cents"`
}

type balanceIn struct {
	OrderID string `json:"order_id"`
}

type balanceOut struct {
	Refunds int `json:"refunds"`
}

func startUpstream(t *testing.T, pool *pgxpool.Pool) *upstreamServer {
	t.Helper()
	u := &upstreamServer{}
	s := newUpstreamServer(pool, u)
	u.srv = httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(u.srv.Close)
	u.URL = u.srv.URL
	return u
}

// newUpstreamServer is the payments MCP server: refund writes the ledger,
// balance reads it.
func newUpstreamServer(pool *pgxpool.Pool, u *upstreamServer) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "refund", Description: "Refunds an order. Cannot be undone."},
		func(ctx context.Context, req *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, refundOut, error) {
			u.calls.Add(1)
			switch in.Reference {
			case "rejected-by-upstream": // refused before running: a JSON-RPC error
				return nil, refundOut{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "reference rejected by the payments server"}
			case "card-declined": // ran and failed: a tool error, nothing written
				return nil, refundOut{}, errors.New("card declined")
			}
			auth, _ := req.Params.Meta[mcpguard.MetaAuthorizationID].(string)
			var id int64
			err := pool.QueryRow(context.WithoutCancel(ctx), `INSERT INTO ledger (order_id, amount_cents, reference, authorization_id)
				VALUES ($1, $2, $3, NULLIF($4, '')) RETURNING id`, in.OrderID, in.AmountCents, in.Reference, auth).Scan(&id)
			if err != nil {
				return nil, refundOut{}, err
			}
			if d := time.Duration(u.delay.Load()); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
			out := refundOut{LedgerID: id, OrderID: in.OrderID, AmountCents: in.AmountCents, Note: strings.Repeat("é", in.Pad/2)}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
				Text: fmt.Sprintf("Refunded %d cents on order %s.\nLedger entry %d.\t(done)%s", in.AmountCents, in.OrderID, id, strings.Repeat(".", in.PadText))}}}, out, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "quote", Description: "Quotes a refund's price now: another answer every call."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in quoteIn) (*mcp.CallToolResult, quoteOut, error) {
			n := u.quotes.Add(1)
			return nil, quoteOut{OrderID: in.OrderID, Quote: n, PriceCents: 1000 + n}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "balance", Description: "Counts the refunds of an order."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in balanceIn) (*mcp.CallToolResult, balanceOut, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE order_id = $1`, in.OrderID).Scan(&n)
			return nil, balanceOut{Refunds: n}, err
		})
	return s
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return s[i]
}
