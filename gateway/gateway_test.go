package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testBundle struct {
	h       *harness.Harness
	base    string
	tokens  map[string]string // org -> token
	reg     *prometheus.Registry
	http    *http.Client
	spec    validator.Validator
	specMu  sync.Mutex
	orgA    string
	rw      *pgx.Conn
	pool    *pgxpool.Pool
	started bool
	inst    *harness.Instance

	stopFirst func()
}

// serve runs a gateway (its own client, the bundle's read-only pool) on a
// real listener and returns its base URL and a function that stops it.
func (b *testBundle) serve(t *testing.T, cfg gateway.Config, reg prometheus.Registerer) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := b.h
	cl, err := client.New(ctx, client.Config{Brokers: h.Brokers, KafkaOpts: h.KafkaOpts,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions,
		FetchMaxWait: 50 * time.Millisecond, DecisionKeys: sink.NewDecisionKeyCache(b.pool)})
	require.NoError(t, err)
	srv, err := gateway.New(cfg, cl, b.pool, reg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = hs.Shutdown(ctx)
			b.http.CloseIdleConnections()
			cl.Close()
		})
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

// startGateway runs another gateway instance beside the first.
func (b *testBundle) startGateway(t *testing.T, cfg gateway.Config) string {
	t.Helper()
	base, _ := b.serve(t, cfg, prometheus.NewRegistry())
	return base
}

// stopFirstGateway stops the first gateway and its client, as a crash
// would leave them: nothing it kept in memory survives.
func (b *testBundle) stopFirstGateway(t *testing.T) {
	t.Helper()
	b.stopFirst()
}

type options struct {
	startProcessor bool
	cfg            gateway.Config
	kafkaOpts      []kgo.Opt                      // every client's, the gateway's too
	configure      func(*processor.ServiceConfig) // the processor's
}

// setup runs a real pipeline (harness), a gateway on a real listener with a
// read-only pool, and tokens for two orgs.
func setup(t *testing.T, o options) *testBundle {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: 3, KafkaOpts: o.kafkaOpts, Configure: o.configure})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rw, err := pgx.Connect(ctx, h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { rw.Close(context.Background()) })
	_, err = sink.Migrate(ctx, rw)
	require.NoError(t, err)
	b := &testBundle{h: h, tokens: map[string]string{}, orgA: "acme", rw: rw, started: o.startProcessor,
		http: &http.Client{Timeout: 60 * time.Second}}
	if o.startProcessor {
		b.inst = h.Start("a")
	}
	for _, org := range []string{"acme", "globex"} {
		_, tok, err := gateway.CreateToken(ctx, rw, org, "test "+org)
		require.NoError(t, err)
		b.tokens[org] = tok
	}

	pcfg, err := pgxpool.ParseConfig(h.DatabaseURL)
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	b.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	b.reg = prometheus.NewRegistry()
	b.base, b.stopFirst = b.serve(t, o.cfg, b.reg)

	b.spec = openAPIValidator(t)
	return b
}

func openAPIValidator(t *testing.T) validator.Validator {
	t.Helper()
	doc, err := libopenapi.NewDocument(gateway.OpenAPI)
	require.NoError(t, err)
	v, errs := validator.NewValidator(doc)
	require.Empty(t, errs)
	return v
}

func (b *testBundle) grant(t *testing.T, mandate string, uses int64) {
	t.Helper()
	cmd := map[string]any{"type": "grant", "org": b.orgA, "mandate_id": mandate, "uses": uses,
		"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"payment.refund"}}
	if !b.started {
		b.h.Send(cmd)
		return
	}
	d := b.h.SendAwait(cmd)
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
}

// response is one real HTTP exchange, its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "%s", r.body)
	return m
}

func (r response) problem(t *testing.T, status int, reason wire.Reason) map[string]any {
	t.Helper()
	require.Equal(t, status, r.status, "%s", r.body)
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	p := r.json(t)
	require.Equal(t, string(reason), p["reason"], "%s", r.body)
	require.Equal(t, "urn:mandated:reason:"+string(reason), p["type"])
	require.EqualValues(t, status, p["status"])
	return p
}

type req struct {
	method, path, token, contentType string
	body                             []byte
	headers                          map[string]string
	invalid                          bool // the request breaks the spec on purpose: check the response only
	unspecified                      bool // the path is not in the spec at all: nothing to check it against
}

// do sends a real request to the first gateway and checks the exchange
// against the OpenAPI document with libopenapi-validator.
func (b *testBundle) do(t *testing.T, r req) response {
	t.Helper()
	return b.doOn(t, b.base, r)
}

// doOn is do on the gateway at base.
func (b *testBundle) doOn(t *testing.T, base string, r req) response {
	t.Helper()
	newReq := func() *http.Request {
		hr, err := http.NewRequest(r.method, base+r.path, bytes.NewReader(r.body))
		require.NoError(t, err)
		if r.token != "" {
			hr.Header.Set("Authorization", "Bearer "+r.token)
		}
		if r.body != nil {
			hr.Header.Set("Content-Type", cmpOr(r.contentType, "application/json"))
		}
		for k, v := range r.headers {
			hr.Header.Set(k, v)
		}
		return hr
	}
	resp, err := b.http.Do(newReq())
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	out := response{status: resp.StatusCode, header: resp.Header, body: body}

	if r.unspecified {
		return out
	}
	check := newReq()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	b.specMu.Lock()
	defer b.specMu.Unlock()
	var ok bool
	var verrs []*verrors.ValidationError
	if r.invalid {
		ok, verrs = b.spec.ValidateHttpResponse(check, resp)
	} else {
		ok, verrs = b.spec.ValidateHttpRequestResponse(check, resp)
	}
	var msgs []string
	for _, e := range verrs {
		msgs = append(msgs, e.Message+": "+e.Reason)
	}
	require.True(t, ok, "%s %s -> %d %s does not match the OpenAPI document: %v", r.method, r.path, out.status, body, msgs)
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func proposeBody(amount int64) []byte {
	return []byte(fmt.Sprintf(`{"operation":"payment.refund","amount":{"minor_units":%d,"currency":"EUR"},"target":"customer-77"}`, amount))
}

func (b *testBundle) propose(t *testing.T, mandate, key string, amount int64, extra map[string]string) response {
	t.Helper()
	hs := map[string]string{"Idempotency-Key": key}
	for k, v := range extra {
		hs[k] = v
	}
	return b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/" + mandate + "/proposals", token: b.tokens["acme"],
		body: proposeBody(amount), headers: hs})
}

func TestGatewayOpenAPIDocumentIsValidOpenAPI31(t *testing.T) {
	t.Parallel()
	doc, err := libopenapi.NewDocument(gateway.OpenAPI)
	require.NoError(t, err)
	require.Equal(t, "3.1.0", doc.GetVersion())
	v, errs := validator.NewValidator(doc)
	require.Empty(t, errs)
	ok, verrs := v.ValidateDocument()
	require.True(t, ok, "%v", verrs)
	_, buildErrs := doc.BuildV3Model()
	require.NoError(t, buildErrs)
}

func TestGatewayProposalDecidedWithinTheWaitIs200AndItsStatusReadsPostgreSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-1", 1)
	key := wire.IntentKey("run-1", "1", "refund")
	r := b.propose(t, "m-1", key, 15000, map[string]string{"Prefer": "wait=10"})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "wait=10", r.header.Get("Preference-Applied"))
	d := r.json(t)
	require.Equal(t, "reserved", d["outcome"])
	authURL := r.header.Get("Content-Location")
	require.Equal(t, "/v1/orgs/acme/mandates/m-1/authorizations/"+d["authorization_id"].(string), authURL)

	a := b.do(t, req{method: "GET", path: authURL, token: b.tokens["acme"]})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "reserved", a.json(t)["state"])
	p := b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-1/proposals/" + key + "?operation=payment.refund", token: b.tokens["acme"]})
	require.Equal(t, http.StatusOK, p.status, "%s", p.body)
	require.Equal(t, "reserved", p.json(t)["outcome"])
	require.Equal(t, d["authorization_id"], p.json(t)["authorization"].(map[string]any)["authorization_id"])

	// The same request again: the original answer, not a second use.
	again := b.propose(t, "m-1", key, 15000, nil)
	require.Equal(t, http.StatusOK, again.status)
	require.Equal(t, "replayed", again.json(t)["outcome"])
	require.Equal(t, d["authorization_id"], again.json(t)["authorization_id"])
	require.GreaterOrEqual(t, testutil.ToFloat64(mustCounter(t, b.reg, "mandated_gateway_waits_total", "decided")), 2.0)
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name, label string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	t.Fatalf("no %s{%s}", name, label)
	return nil
}

// No decision within the wait: 202 with a stable status URL that reads
// PostgreSQL; the same org's next command beyond the in-flight bound is 429.
func TestGatewayNoDecisionWithinTheWaitIs202AndTheStatusURLShowsTheDecisionLater(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true, cfg: gateway.Config{MaxInFlightPerOrg: 1}})
	b.grant(t, "m-late", 1)
	b.h.Stop(b.inst) // nothing decides now
	key := wire.IntentKey("run-2", "1", "refund")

	held := make(chan response, 1)
	go func() { held <- b.propose(t, "m-late", key, 15000, map[string]string{"Prefer": "wait=3"}) }()
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return testutil.ToFloat64(inFlight(t, b.reg)) == 1
	}, "the first command is waiting")
	tooMany := b.propose(t, "m-late", "other-key", 15000, nil)
	tooMany.problem(t, http.StatusTooManyRequests, gateway.ReasonTooManyInFlight)
	require.Equal(t, "1", tooMany.header.Get("Retry-After"))

	r := <-held
	loc := accepted(t, r)
	require.Equal(t, "/v1/orgs/acme/mandates/m-late/requests/"+r.header.Get("Request-Id"), loc)
	pending := b.do(t, req{method: "GET", path: loc, token: b.tokens["acme"]})
	require.Equal(t, http.StatusOK, pending.status, "%s", pending.body)
	require.Equal(t, "pending", pending.json(t)["status"])
	b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-late/proposals/" + key, token: b.tokens["acme"]}).
		problem(t, http.StatusNotFound, gateway.ReasonNoDecisionRecorded)

	b.h.Start("b") // a processor comes back: the accepted command is decided
	st := b.decided(t, b.base, loc)
	require.Equal(t, "reserved", st["decision"].(map[string]any)["outcome"])
	require.EqualValues(t, 200, st["http_status"])
	p := b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-late/proposals/" + key, token: b.tokens["acme"]})
	require.Equal(t, http.StatusOK, p.status, "%s", p.body)
	require.Equal(t, "reserved", p.json(t)["authorization"].(map[string]any)["state"])
}

func inFlight(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
	for _, mf := range mfs {
		if mf.GetName() == "mandated_gateway_commands_in_flight" {
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	return g
}

// Seed 002 over HTTP: eight concurrent resumes of one approval. Each caller
// begins as its own executor; the one answered 200 executing runs the
// side effect and commits; the others are answered 409 already_executing
// with the winner, and read the authorization's row until it is settled.
func TestGatewayEightConcurrentResumesOfOneApprovalExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-approval", 1)
	r := b.propose(t, "m-approval", "approval-1842", 15000, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	authID := r.json(t)["authorization_id"].(string)
	authPath := "/v1/orgs/acme/mandates/m-approval/authorizations/" + authID

	var mu sync.Mutex
	var ledger []string // a side-effect ledger that does not deduplicate
	const n = 8
	refs := make([]string, n)
	results := make([]string, n)
	codes := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			begin := b.do(t, req{method: "POST", path: authPath + "/begin", token: b.tokens["acme"],
				headers: map[string]string{"Executor": fmt.Sprintf("worker-%d", i)}})
			codes[i] = begin.status
			if begin.status == http.StatusOK {
				require.Equal(t, "executing", begin.json(t)["outcome"])
				mu.Lock()
				ledger = append(ledger, authID)
				ref := fmt.Sprintf("re_%d", len(ledger))
				mu.Unlock()
				commit := map[string]any{"external_ref": ref, "result": map[string]any{"refund": ref}}
				if tok, ok := begin.json(t)["execution_token"]; ok { // the executor boundary's token
					commit["execution_token"] = tok
				}
				body, err := json.Marshal(commit)
				require.NoError(t, err)
				c := b.do(t, req{method: "POST", path: authPath + "/commit", token: b.tokens["acme"], body: body})
				require.Equal(t, http.StatusOK, c.status, "%s", c.body)
				refs[i] = c.json(t)["authorization"].(map[string]any)["external_ref"].(string)
				st := b.do(t, req{method: "GET", path: authPath, token: b.tokens["acme"]})
				results[i] = fmt.Sprint(st.json(t)["result"])
				return
			}
			// A loser is told who holds it, never to execute; it reads the
			// source of truth until the winner settles (fail closed on timeout).
			require.Equal(t, http.StatusConflict, begin.status, "%s", begin.body)
			require.Contains(t, []any{"already_executing", "terminal_state"}, begin.json(t)["reason"])
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				st := b.do(t, req{method: "GET", path: authPath, token: b.tokens["acme"]})
				if m := st.json(t); m["terminal"] == true {
					refs[i] = m["external_ref"].(string)
					results[i] = fmt.Sprint(m["result"])
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Len(t, ledger, 1, "the side effect ran once")
	winners := 0
	for i := range n {
		require.Equal(t, refs[0], refs[i], "caller %d sees the same outcome", i)
		require.Equal(t, results[0], results[i], "caller %d reads the same recorded result", i)
		require.NotEmpty(t, refs[i], "caller %d saw the outcome (did not time out in doubt)", i)
		if codes[i] == http.StatusOK {
			winners++
		}
	}
	require.Equal(t, 1, winners)
}

func TestGatewayTokensActForTheirOrgOnlyAndNeverForTheControlPlane(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-iso", 1)
	r := b.propose(t, "m-iso", "iso-1", 15000, nil)
	require.Equal(t, http.StatusOK, r.status)
	authPath := "/v1/orgs/acme/mandates/m-iso/authorizations/" + r.json(t)["authorization_id"].(string)
	other := b.tokens["globex"]

	// Org globex's token can neither act on nor read org acme.
	b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-iso/proposals", token: other, body: proposeBody(100),
		headers: map[string]string{"Idempotency-Key": "iso-2"}}).problem(t, http.StatusForbidden, gateway.ReasonOrgForbidden)
	b.do(t, req{method: "POST", path: authPath + "/begin", token: other, body: []byte(`{}`)}).problem(t, http.StatusForbidden, gateway.ReasonOrgForbidden)
	b.do(t, req{method: "GET", path: authPath, token: other}).problem(t, http.StatusForbidden, gateway.ReasonOrgForbidden)
	b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-iso/proposals/iso-1", token: other}).problem(t, http.StatusForbidden, gateway.ReasonOrgForbidden)
	// Nor can acme's own token write grants or resolve.
	b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-iso/grants", token: b.tokens["acme"], body: []byte(`{}`), invalid: true}).
		problem(t, http.StatusForbidden, gateway.ReasonControlPlane)
	b.do(t, req{method: "POST", path: authPath + "/resolve", token: b.tokens["acme"], body: []byte(`{"outcome":"cancelled"}`), invalid: true}).
		problem(t, http.StatusForbidden, gateway.ReasonControlPlane)
	// Without a token, with a made-up one, or with a revoked one: 401.
	b.do(t, req{method: "GET", path: authPath, invalid: true}).problem(t, http.StatusUnauthorized, gateway.ReasonUnauthenticated)
	p := b.do(t, req{method: "GET", path: authPath, token: "mgw_aaaaaaaaaaaaaaaa_bbbb"}).problem(t, http.StatusUnauthorized, gateway.ReasonUnauthenticated)
	require.Equal(t, "the bearer token is unknown or revoked", p["detail"])
	// An operator token is the console's: the API says so, as the console
	// says of an API token.
	_, operator, err := gateway.CreateOperatorToken(context.Background(), b.rw, "ops")
	require.NoError(t, err)
	p = b.do(t, req{method: "GET", path: authPath, token: operator}).problem(t, http.StatusUnauthorized, gateway.ReasonUnauthenticated)
	require.Contains(t, p["detail"], "that is an operator token: it signs in to the console only")
	ts, err := gateway.ListTokens(context.Background(), b.rw, "globex")
	require.NoError(t, err)
	require.Len(t, ts, 1)
	require.NoError(t, gateway.RevokeToken(context.Background(), b.rw, ts[0].ID))
	b.do(t, req{method: "GET", path: "/v1/orgs/globex/mandates/x/authorizations/y", token: other}).
		problem(t, http.StatusUnauthorized, gateway.ReasonUnauthenticated)
	// The state is untouched by all of it.
	st := b.do(t, req{method: "GET", path: authPath, token: b.tokens["acme"]})
	require.Equal(t, "reserved", st.json(t)["state"])
}

// Every problem status the API documents, produced by a real request.
func TestGatewayEveryProblemStatusFromARealRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true, cfg: gateway.Config{MaxBodyBytes: 4096}})
	b.grant(t, "m-p", 2)
	tok := b.tokens["acme"]
	prop := "/v1/orgs/acme/mandates/m-p/proposals"
	ok := b.propose(t, "m-p", "p-1", 15000, nil)
	require.Equal(t, http.StatusOK, ok.status, "%s", ok.body)
	authPath := "/v1/orgs/acme/mandates/m-p/authorizations/" + ok.json(t)["authorization_id"].(string)

	for _, tc := range []struct {
		name   string
		r      req
		status int
		reason wire.Reason
	}{
		{"malformed JSON is 400", req{method: "POST", path: prop, token: tok, body: []byte(`{"operation":`), headers: map[string]string{"Idempotency-Key": "p-2"}, invalid: true}, 400, wire.ReasonMalformedJSON},
		{"a field of the URL in the body is 400", req{method: "POST", path: prop, token: tok, body: []byte(`{"org":"globex","operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR"},"target":"t"}`), headers: map[string]string{"Idempotency-Key": "p-2"}}, 400, wire.ReasonFieldInvalid},
		{"an invalid currency is 400 with the wire's reason", req{method: "POST", path: prop, token: tok, body: []byte(`{"operation":"payment.refund","amount":{"minor_units":1,"currency":"EURO"},"target":"t"}`), headers: map[string]string{"Idempotency-Key": "p-2"}, invalid: true}, 400, wire.ReasonCurrencyInvalid},
		{"an unknown field is 400", req{method: "POST", path: prop, token: tok, body: []byte(`{"operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR"},"target":"t","colour":"red"}`), headers: map[string]string{"Idempotency-Key": "p-2"}}, 400, wire.ReasonUnknownField},
		{"a proposal without Idempotency-Key is 400", req{method: "POST", path: prop, token: tok, body: proposeBody(1), invalid: true}, 400, gateway.ReasonMissingIdempotencyKey},
		{"no token is 401", req{method: "POST", path: prop, body: proposeBody(1), headers: map[string]string{"Idempotency-Key": "p-2"}, invalid: true}, 401, gateway.ReasonUnauthenticated},
		{"another org's token is 403", req{method: "POST", path: prop, token: b.tokens["globex"], body: proposeBody(1), headers: map[string]string{"Idempotency-Key": "p-2"}}, 403, gateway.ReasonOrgForbidden},
		{"an unknown authorization is 404", req{method: "GET", path: "/v1/orgs/acme/mandates/m-p/authorizations/au_nope", token: tok}, 404, wire.ReasonAuthorizationNotFound},
		{"beginning an unknown authorization is 404", req{method: "POST", path: "/v1/orgs/acme/mandates/m-p/authorizations/au_nope/begin", token: tok, body: []byte(`{}`), headers: map[string]string{"Idempotency-Key": "worker-1"}}, 404, wire.ReasonAuthorizationNotFound},
		{"an Executor on a commit is 400", req{method: "POST", path: authPath + "/commit", token: tok, body: []byte(`{"external_ref":"re_9"}`), headers: map[string]string{"Executor": "w-1"}, invalid: true}, 400, wire.ReasonFieldInvalid},
		{"a duplicate member is 400 as on Kafka", req{method: "POST", path: prop, token: tok, body: []byte(`{"operation":"payment.refund","operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR"},"target":"t"}`), headers: map[string]string{"Idempotency-Key": "p-6"}}, 400, wire.ReasonAmbiguousField},
		{"an unknown request is 404", req{method: "GET", path: "/v1/orgs/acme/mandates/m-p/requests/rq-0-999999-aaaaaaaaaaaaaaaaaaaaaaaaaa", token: tok}, 404, gateway.ReasonRequestNotFound},
		{"an unknown route is 404", req{method: "GET", path: "/v2/nothing", token: tok, unspecified: true}, 404, gateway.ReasonNotFound},
		{"a stale mandate version is 409", req{method: "POST", path: prop, token: tok, body: []byte(`{"operation":"payment.refund","amount":{"minor_units":1,"currency":"EUR"},"target":"t","based_on_version":99}`), headers: map[string]string{"Idempotency-Key": "p-3"}}, 409, wire.ReasonStaleVersion},
		{"committing a reserved authorization twice with another reference is 409", req{}, 409, wire.ReasonOtherExternalRef},
		{"a body over the limit is 413", req{method: "POST", path: prop, token: tok, body: []byte(`{"operation":"payment.refund","target":"` + strings.Repeat("x", 5000) + `"}`), headers: map[string]string{"Idempotency-Key": "p-4"}, invalid: true}, 413, wire.ReasonTooLarge},
		{"a body that is not JSON is 415", req{method: "POST", path: prop, token: tok, body: []byte(`operation=refund`), contentType: "application/x-www-form-urlencoded", headers: map[string]string{"Idempotency-Key": "p-5"}, invalid: true}, 415, gateway.ReasonUnsupportedMediaType},
		{"the same key with another payload is 422", req{method: "POST", path: prop, token: tok, body: proposeBody(9999), headers: map[string]string{"Idempotency-Key": "p-1"}}, 422, wire.ReasonIdempotencyConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.r.method == "" { // commit with one reference, then another
				c := b.do(t, req{method: "POST", path: authPath + "/commit", token: tok, body: []byte(`{"external_ref":"re_1"}`)})
				require.Equal(t, http.StatusOK, c.status, "%s", c.body)
				tc.r = req{method: "POST", path: authPath + "/commit", token: tok, body: []byte(`{"external_ref":"re_2"}`)}
			}
			p := b.do(t, tc.r).problem(t, tc.status, tc.reason)
			if tc.status == 409 || tc.status == 422 {
				require.NotNil(t, p["decision"], "a problem from a decision carries it")
			}
		})
	}
}

// A second language: Python's standard library (urllib only) proposes,
// begins and commits through the gateway.
func TestGatewayPythonStandardLibraryClient(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the second-language client cannot run")
	}
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-py", 1)
	script, err := filepath.Abs(filepath.Join("testdata", "urllib_client.py"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, script)
	cmd.Env = append(os.Environ(), "GATEWAY_URL="+b.base, "GATEWAY_TOKEN="+b.tokens["acme"], "GATEWAY_ORG=acme", "GATEWAY_MANDATE=m-py")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "committed re_py_1")
	st := b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-py/proposals/" + wire.IntentKey("py-run", "1", "refund"), token: b.tokens["acme"]})
	require.Equal(t, "committed", st.json(t)["authorization"].(map[string]any)["state"])
}

// A client that never finishes its request headers is cut off after
// ReadHeaderTimeout (slowloris), and an oversized header is refused.
func TestGatewayBoundsSlowAndLargeHeaders(t *testing.T) {
	t.Parallel()
	srv, err := gateway.New(gateway.Config{ReadHeaderTimeout: 300 * time.Millisecond, MaxHeaderBytes: 4096}, nil, nil, nil)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	defer func() { // Shutdown waits for net/http's lingering close after the 431
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}()

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("GET /v1/openapi.yaml HTTP/1.1\r\nHost: x\r\n")) // and never the blank line
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadAll(conn)
	require.NoError(t, err, "the server closes the connection (EOF), not our 20 s deadline")
	require.Less(t, time.Since(start), 10*time.Second)

	req, err := http.NewRequest("GET", "http://"+ln.Addr().String()+"/v1/openapi.yaml", nil)
	require.NoError(t, err)
	req.Header.Set("X-Padding", strings.Repeat("a", 8192))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}
