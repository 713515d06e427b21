package console_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/gateway/console"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Chromium's DevTools connection and the pools' background
		// health checks end after the test's cleanups, asynchronously.
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

type testBundle struct {
	h        *harness.Harness
	base     string
	rw       *pgx.Conn
	cl       *client.Client
	operator string // an operator token
	apiToken string // an API token of acme
	signer   *client.Signer
}

// setup runs a pipeline (harness), a gateway with its console on a real
// listener, an operator token and an API token; org globex requires signed
// grantor commands and the console holds its key.
func setup(t *testing.T) *testBundle {
	t.Helper()
	return setupAs(t, nil)
}

// setupAs is setup with the gateway's pool connecting as the URL dbURL
// returns for the harness's database (nil: mandated's own role).
func setupAs(t *testing.T, dbURL func(h *harness.Harness) string) *testBundle {
	t.Helper()
	return setupWith(t, dbURL, console.Config{})
}

// setupWith is setupAs with the console's config (its signers are added).
func setupWith(t *testing.T, dbURL func(h *harness.Harness) string, ccfg console.Config) *testBundle {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: 3})
	h.Start("a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rw, err := pgx.Connect(ctx, h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { rw.Close(context.Background()) })
	b := &testBundle{h: h, rw: rw}
	_, b.operator, err = gateway.CreateOperatorToken(ctx, rw, "on-call")
	require.NoError(t, err)
	_, b.apiToken, err = gateway.CreateToken(ctx, rw, "acme", "refund-agent")
	require.NoError(t, err)

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	require.NoError(t, admin.AddGrantorKey(ctx, rw, sink.GrantorKey{Org: "globex", KeyID: "reconciler-2026", Alg: "ed25519", PublicKey: pub,
		ValidFrom: time.Now().Add(-time.Hour), ValidUntil: time.Now().Add(24 * time.Hour)}))
	b.signer = &client.Signer{KeyID: "reconciler-2026", Key: priv}

	b.cl, err = client.New(ctx, client.Config{Brokers: h.Brokers, KafkaOpts: h.KafkaOpts, ProposalsTopic: h.Spec.Proposals,
		GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions, FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	poolURL := h.DatabaseURL
	if dbURL != nil {
		poolURL = dbURL(h)
	}
	pcfg, err := pgxpool.ParseConfig(poolURL)
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	srv, err := gateway.New(gateway.Config{}, b.cl, pool, prometheus.NewRegistry())
	require.NoError(t, err)
	ccfg.Signers = map[string]*client.Signer{"globex": b.signer}
	con, err := console.New(ccfg,
		console.Sources{Client: b.cl, Control: pool, Operator: func() *sink.Operator { return sink.NewOperator(pool) }})
	require.NoError(t, err)
	con.Register(srv.Mux())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		b.cl.Close()
		pool.Close()
	})
	b.base = "http://" + ln.Addr().String()
	return b
}

func (b *testBundle) grant(t *testing.T, org, mandate string, uses int64) {
	t.Helper()
	d := b.h.SendAwait(map[string]any{"type": "grant", "org": org, "mandate_id": mandate, "uses": uses,
		"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"payment.refund"}})
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%s", d.Detail)
}

// inDoubt makes an in-doubt execution: proposed, begun by executor, its
// outcome reported unknown.
func (b *testBundle) inDoubt(t *testing.T, org, mandate, executor string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := b.cl.Propose(ctx, client.Propose{Ref: client.Ref{Org: org, MandateID: mandate}, IdempotencyKey: "k-" + executor,
		Operation: "payment.refund", Target: "customer-77", Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"}})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	ref := client.RefOf(d)
	begun, err := b.cl.Begin(ctx, client.Begin{AuthorizationRef: ref, Executor: executor})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeExecuting, begun.Outcome)
	u, err := b.cl.ReportUnknown(ctx, client.ReportUnknown{AuthorizationRef: ref, ExecutionToken: begun.ExecutionToken(),
		Detail: "provider timed out after 30 s"})
	require.NoError(t, err)
	require.Equal(t, wire.StateInDoubt, u.State())
	return d.AuthorizationID
}

// forked makes a mandate whose intent was reserved, cancelled, forked and
// committed with a result.
func (b *testBundle) forked(t *testing.T, org, mandate string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	intent := map[string]any{"run_id": "run-5521", "step": "refund", "action": "refund:customer-77"}
	propose := func(key, forkOf string) wire.Decision {
		cmd := map[string]any{"type": "propose", "org": org, "mandate_id": mandate, "idempotency_key": key, "intent": intent,
			"operation": "payment.refund", "target": "customer-77", "amount": map[string]any{"minor_units": 15000, "currency": "EUR"}}
		if forkOf != "" {
			cmd["fork_of"] = forkOf
		}
		return b.h.SendAwait(cmd)
	}
	first := propose("uuid-1", "")
	require.Equal(t, wire.OutcomeReserved, first.Outcome)
	c, err := b.cl.Cancel(ctx, client.Cancel{AuthorizationRef: client.AuthorizationRef{Org: org, MandateID: mandate, AuthorizationID: first.AuthorizationID},
		Reason: "the customer asked to wait"})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeCancelled, c.Outcome)
	fork := propose("uuid-2", first.AuthorizationID)
	require.Equal(t, wire.OutcomeReserved, fork.Outcome, "%s %s", fork.Reason, fork.Detail)
	ex, err := b.cl.Execute(ctx, client.AuthorizationRef{Org: org, MandateID: mandate, AuthorizationID: fork.AuthorizationID}, func(context.Context, string) (client.Effect, error) {
		return client.Effect{ExternalRef: "re_3PqX9a", Result: []byte(`{"refund_id":"re_3PqX9a","status":"succeeded"}`)}, nil
	})
	require.NoError(t, err)
	require.True(t, ex.Ran)
}

// browser starts Debian's chromium, headless, with an empty profile.
func browser(t *testing.T) context.Context {
	t.Helper()
	testenv.SkipInShortTier(t, "drives a headless chromium")
	if os.Getenv("MANDATED_TEST_BROWSER") == "skip" {
		t.Skip("MANDATED_TEST_BROWSER=skip")
	}
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	require.NotEmpty(t, path, "a headless browser is required: Debian's chromium (test/infra/run-tests.sh installs it; MANDATED_TEST_BROWSER=skip to skip)")
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1440, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	ctx, cancel := context.WithTimeout(bctx, 5*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// shots writes full-page screenshots to MANDATED_CONSOLE_SCREENSHOTS (a
// directory, relative to the repository's root), when set.
type shots struct {
	dir string
	mu  sync.Mutex
}

func newShots(t *testing.T) *shots {
	t.Helper()
	dir := os.Getenv("MANDATED_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return &shots{}
	}
	if !filepath.IsAbs(dir) {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		require.NoError(t, err)
		dir = filepath.Join(root, dir)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return &shots{dir: dir}
}

func (s *shots) take(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if s.dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.NoError(t, os.WriteFile(filepath.Join(s.dir, name+".png"), png, 0o644))
}

// submit runs an action that posts a form (or follows one) and waits for
// the page it loads, whose status must be want (after redirects).
func submit(t *testing.T, ctx context.Context, action chromedp.Action[chromedp.Void], want int) {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, action)
	require.NoError(t, err)
	require.NotNil(t, resp, "the form loaded no page")
	require.Equal(t, int64(want), resp.Status, "%s", resp.URL)
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, "text of %s", sel)
	return s
}

// An operator signs in with an operator token, sees the in-doubt queue
// with each execution's age and executor, reconciles one (unsigned, then
// one of an org that requires signatures, signed with the console's key),
// opens a mandate's page (terms, uses, authorizations, results, fork
// lineage), the partitions and the last verify, in a real headless
// browser; each page is screenshotted when MANDATED_CONSOLE_SCREENSHOTS is
// set (docs/console/).
func TestAnOperatorReconcilesInTheConsoleInARealBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := browser(t)
	shot := newShots(t)

	b.grant(t, "acme", "refund-case-1842", 2)
	b.grant(t, "acme", "refund-case-1907", 3)
	b.grant(t, "globex", "payout-77", 1)
	b.forked(t, "acme", "refund-case-1907")
	acmeAuth := b.inDoubt(t, "acme", "refund-case-1842", "worker-7f3a.attempt-2")
	b.inDoubt(t, "acme", "refund-case-1907", "worker-19c2.attempt-1")
	globexAuth := b.inDoubt(t, "globex", "payout-77", "payout-runner-3.attempt-1")
	ctxDB, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, admin.SetSigningMode(ctxDB, b.rw, "globex", sink.SigningRequired))
	recordVerify(t, b)

	// Not signed in: the sign-in form. An org's API token does not open it.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/"), chromedp.WaitVisible(chromedp.ID("token"))))
	shot.take(t, ctx, "1-sign-in")
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("token"), b.apiToken)))
	submit(t, ctx, chromedp.Submit(chromedp.ID("token")), http.StatusUnauthorized)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(".problem"))))
	require.Contains(t, text(t, ctx, ".problem"), "API token of an org")

	// Signed in: the in-doubt queue, oldest first, with age and executor.
	// The refused form came back empty.
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("token"), b.operator)))
	submit(t, ctx, chromedp.Submit(chromedp.ID("token")), http.StatusOK)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("table"))))
	queue := text(t, ctx, "main")
	require.Contains(t, queue, "3 in doubt")
	for _, want := range []string{"acme/refund-case-1842", "worker-7f3a.attempt-2", "globex/payout-77", "payout-runner-3.attempt-1", "provider timed out",
		"150.00 EUR"} {
		require.Contains(t, queue, want)
	}
	require.NotContains(t, queue, "15000 EUR", "amounts by the currency's exponent")
	page, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	require.NoError(t, err)
	require.NotContains(t, page, b.operator, "no secret in a page")
	shot.take(t, ctx, "2-in-doubt")

	// Reconcile acme's: committed, with the provider's reference.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/reconcile/acme/refund-case-1842/"+acmeAuth),
		chromedp.WaitVisible(chromedp.ID("evidence")),
		chromedp.Click(chromedp.CSS(`input[value="committed"]`)),
		chromedp.SendKeys(chromedp.ID("external_ref"), "re_3PqX9a2eZvKYlo2C1xQ"),
		chromedp.SendKeys(chromedp.ID("evidence"), "the provider lists refund re_3PqX9a2eZvKYlo2C1xQ at 08:12Z")))
	shot.take(t, ctx, "3-reconcile")
	submit(t, ctx, chromedp.Submit(chromedp.ID("evidence")), http.StatusOK)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(".ok"))))
	require.Contains(t, text(t, ctx, ".ok"), "Resolved committed")
	shot.take(t, ctx, "4-resolved")
	row := authRow(t, b, "acme", "refund-case-1842", acmeAuth)
	require.Equal(t, "committed", row.state)
	require.Equal(t, "re_3PqX9a2eZvKYlo2C1xQ", row.ref)

	// globex requires signatures: the console signs with its key.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/reconcile/globex/payout-77/"+globexAuth),
		chromedp.WaitVisible(chromedp.ID("evidence"))))
	require.Contains(t, text(t, ctx, "main"), "reconciler-2026")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`input[value="cancelled"]`)),
		chromedp.SendKeys(chromedp.ID("evidence"), "provider: no such payout; idempotency key voided")))
	submit(t, ctx, chromedp.Submit(chromedp.ID("evidence")), http.StatusOK)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(".ok"))))
	require.Contains(t, text(t, ctx, ".ok"), "Resolved cancelled")
	require.Contains(t, text(t, ctx, "pre"), `"signed_by": "reconciler-2026"`)
	require.Equal(t, "cancelled", authRow(t, b, "globex", "payout-77", globexAuth).state)

	// Both resolves are on the grants topic, as mandatectl reconcile
	// writes them: the evidence, and the signature where required.
	acmeRec, globexRec := grantsRecord(t, b, acmeAuth), grantsRecord(t, b, globexAuth)
	require.Equal(t, "resolve", acmeRec["type"])
	require.Equal(t, "committed", acmeRec["outcome"])
	require.Equal(t, "the provider lists refund re_3PqX9a2eZvKYlo2C1xQ at 08:12Z", acmeRec["evidence"])
	require.NotContains(t, acmeRec, "signature", "acme does not require signatures")
	require.Equal(t, "cancelled", globexRec["outcome"])
	require.Equal(t, "provider: no such payout; idempotency key voided", globexRec["evidence"])
	sig, ok := globexRec["signature"].(map[string]any)
	require.True(t, ok, "globex's resolve is signed: %v", globexRec)
	require.Equal(t, "reconciler-2026", sig["key_id"])
	require.Equal(t, "ed25519", sig["alg"])

	// The resolved execution keeps its story on its mandate's page.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/mandates/acme/refund-case-1842"), chromedp.WaitVisible(chromedp.CSS("dl.resolution"))))
	story := text(t, ctx, "dl.resolution")
	for _, want := range []string{"Resolved by", "console:ot_", "the provider lists refund re_3PqX9a2eZvKYlo2C1xQ at 08:12Z", "provider timed out after 30 s"} {
		require.Contains(t, story, want)
	}

	// Its timeline: propose → reserve → begin → report → resolve, each
	// with who acted: the executor, then the operator's console session.
	waitKept(t, b, "acme", "refund-case-1842", 5)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/authorizations/acme/refund-case-1842/"+acmeAuth),
		chromedp.WaitVisible(chromedp.CSS("ol.flow"))))
	flow := text(t, ctx, "ol.flow")
	for _, want := range []string{"propose → reserve", "begin", "executor worker-7f3a.attempt-2", "report", "provider timed out after 30 s",
		"resolve", "reconciler console:ot_", "re_3PqX9a2eZvKYlo2C1xQ", "evidence: the provider lists refund"} {
		require.Contains(t, flow, want)
	}

	// The queue has one left.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/"), chromedp.WaitVisible(chromedp.CSS("table"))))
	require.Contains(t, text(t, ctx, ".summary"), "1 in doubt")

	// A mandate's page: terms, uses, authorizations with results, the fork lineage.
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`input[name="q"]`), "acme/refund-case-1907")))
	submit(t, ctx, chromedp.Submit(chromedp.CSS(`input[name="q"]`)), http.StatusOK)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("ul.lineage"))))
	mandate := text(t, ctx, "main")
	for _, want := range []string{"Fork lineage", "→", "re_3PqX9a", `"refund_id":"re_3PqX9a"`, "worker-19c2.attempt-1", "in_doubt", "committed", "cancelled", "payment.refund"} {
		require.Contains(t, mandate, want)
	}
	shot.take(t, ctx, "5-mandate")

	// The partitions: owner, epoch, lag, outbox backlog.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/partitions"), chromedp.WaitVisible(chromedp.CSS("table"))))
	parts := text(t, ctx, "table")
	require.Contains(t, parts, "Outbox backlog")
	require.Contains(t, parts, "a") // the owner's name
	shot.take(t, ctx, "6-partitions")

	// The last verify.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/verify"), chromedp.WaitVisible(chromedp.CSS(".verdict"))))
	require.Contains(t, text(t, ctx, ".verdict"), "Verified")
	shot.take(t, ctx, "7-verify")
}

// grantsRecord reads the grants topic from its start for the resolve of
// an authorization and returns it decoded.
func grantsRecord(t *testing.T, b *testBundle, authorizationID string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := append([]kgo.Opt{kgo.SeedBrokers(b.h.Brokers...), kgo.ConsumeTopics(b.h.Spec.Grants),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond)}, b.h.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no resolve of %s on %s", authorizationID, b.h.Spec.Grants)
		for _, fe := range fs.Errors() {
			require.NoError(t, fe.Err)
		}
		for it := fs.RecordIter(); !it.Done(); {
			var cmd map[string]any
			if json.Unmarshal(it.Next().Value, &cmd) == nil && cmd["type"] == "resolve" && cmd["authorization_id"] == authorizationID {
				return cmd
			}
		}
	}
}

type row struct{ state, ref string }

func authRow(t *testing.T, b *testBundle, org, mandate, id string) row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var r row
	require.NoError(t, b.rw.QueryRow(ctx, `SELECT state, external_ref FROM authorizations WHERE org = $1 AND mandate_id = $2 AND authorization_id = $3`,
		org, mandate, id).Scan(&r.state, &r.ref))
	return r
}

// recordVerify runs the auditor over the pipeline and records its result
// as mandatectl verify --record does.
func recordVerify(t *testing.T, b *testBundle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, b.h.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	start := time.Now()
	opts := append([]kgo.Opt{kgo.SeedBrokers(b.h.Brokers...)}, b.h.KafkaOpts...)
	rep, err := verify.Run(ctx, verify.Config{Pool: pool, KafkaOpts: opts, DecisionsTopic: b.h.Spec.Decisions, DeadLetterTopic: b.h.Spec.DeadLetter})
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v", rep)
	report, err := json.Marshal(rep)
	require.NoError(t, err)
	_, err = admin.RecordVerifyRun(ctx, b.rw, admin.VerifyRun{StartedAt: start, FinishedAt: time.Now(), Completed: true, OK: true,
		Partitions: len(rep.Partitions), Records: rep.Records, Host: "verify-cronjob-29411", Report: report})
	require.NoError(t, err)
}

// The console's doors: an API token opens no page, an operator token opens
// no API route, a form without the session's CSRF token or from another
// origin changes nothing, and a revoked operator token is out at once.
func TestTheConsoleTakesOperatorTokensOnlyAndRefusesForgedForms(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t, "acme", "m-csrf", 1)
	auth := b.inDoubt(t, "acme", "m-csrf", "worker-1")
	hc := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, bearer string, form url.Values, headers map[string]string) *http.Response {
		t.Helper()
		var body *strings.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		} else {
			body = strings.NewReader("")
		}
		req, err := http.NewRequest(method, b.base+path, body)
		require.NoError(t, err)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}

	// An API token opens no console page; an operator token no API route.
	r := do("GET", "/console/", b.apiToken, nil, nil)
	require.Equal(t, http.StatusSeeOther, r.StatusCode)
	require.Equal(t, "/console/login", r.Header.Get("Location"))
	require.Equal(t, http.StatusUnauthorized, do("GET", "/v1/orgs/acme/mandates/m-csrf/authorizations/"+auth, b.operator, nil, nil).StatusCode)
	require.Equal(t, http.StatusOK, do("GET", "/v1/orgs/acme/mandates/m-csrf/authorizations/"+auth, b.apiToken, nil, nil).StatusCode)
	ok := do("GET", "/console/", b.operator, nil, nil)
	require.Equal(t, http.StatusOK, ok.StatusCode)
	require.Contains(t, ok.Header.Get("Content-Security-Policy"), "default-src 'none'")

	// Forged forms change nothing.
	form := url.Values{"outcome": {"committed"}, "external_ref": {"re_forged"}, "evidence": {"forged"}}
	path := "/console/reconcile/acme/m-csrf/" + auth
	require.Equal(t, http.StatusForbidden, do("POST", path, b.operator, form, nil).StatusCode, "no CSRF token")
	form.Set("csrf", strings.Repeat("0", 64))
	require.Equal(t, http.StatusForbidden, do("POST", path, b.operator, form, nil).StatusCode, "another session's token")

	// The session's own token, through a sign-in, but posted from another site.
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	hc.Jar = jar
	login := do("POST", "/console/login", "", url.Values{"token": {b.operator}}, map[string]string{"Origin": b.base})
	require.Equal(t, http.StatusSeeOther, login.StatusCode)
	var cookie *http.Cookie
	for _, c := range login.Cookies() {
		if c.Name == console.CookieName {
			cookie = c
		}
	}
	require.NotNil(t, cookie)
	require.True(t, cookie.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	require.Equal(t, "/console", cookie.Path)
	form.Set("csrf", csrfOf(t, b, hc))
	require.Equal(t, http.StatusForbidden, do("POST", path, "", form, map[string]string{"Origin": "https://evil.example"}).StatusCode, "another origin")
	require.Equal(t, http.StatusForbidden, do("POST", path, "", form, map[string]string{"Origin": b.base, "Sec-Fetch-Site": "cross-site"}).StatusCode,
		"a browser names a cross-site form")
	// Two Origins (or two Sec-Fetch-Sites) are ambiguous: whichever one a
	// proxy read, the form is refused.
	for _, name := range []string{"Origin", "Sec-Fetch-Site"} {
		req, err := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if name == "Origin" {
			req.Header.Add("Origin", b.base)
			req.Header.Add("Origin", "https://evil.example")
		} else {
			req.Header.Add("Sec-Fetch-Site", "same-origin")
			req.Header.Add("Sec-Fetch-Site", "cross-site")
		}
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "two %s headers", name)
	}
	require.Equal(t, "in_doubt", authRow(t, b, "acme", "m-csrf", auth).state, "nothing forged was resolved")

	// A revoked operator token is out at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ts, err := gateway.ListTokens(ctx, b.rw, "")
	require.NoError(t, err)
	for _, tk := range ts {
		if tk.Kind == gateway.KindOperator {
			require.NoError(t, gateway.RevokeToken(ctx, b.rw, tk.ID))
		}
	}
	require.Equal(t, http.StatusSeeOther, do("GET", "/console/", "", nil, nil).StatusCode)
}

// csrfOf reads the session's CSRF token from a page (the hidden field).
func csrfOf(t *testing.T, b *testBundle, hc *http.Client) string {
	t.Helper()
	resp, err := hc.Get(b.base + "/console/")
	require.NoError(t, err)
	defer resp.Body.Close()
	var sb strings.Builder
	_, err = io.Copy(&sb, resp.Body)
	require.NoError(t, err)
	page := sb.String()
	i := strings.Index(page, `name="csrf" value="`)
	require.Positive(t, i, "a page carries the session's CSRF token")
	rest := page[i+len(`name="csrf" value="`):]
	return rest[:strings.Index(rest, `"`)]
}

// The console as deployed: the gateway's pool connects as the role of
// deploy/postgres/gateway-role.sql, created from the file as written, and
// every page answers 200 with its content, not a permission error.
func TestTheConsoleReadsWithTheGatewaysDocumentedRole(t *testing.T) {
	t.Parallel()
	var role string
	b := setupAs(t, func(h *harness.Harness) string {
		var password string
		role, password = gatewayRole(t, h.DatabaseURL)
		u, err := url.Parse(h.DatabaseURL)
		require.NoError(t, err)
		u.User = url.UserPassword(role, password)
		return u.String()
	})
	b.grant(t, "acme", "m-role", 2)
	auth := b.inDoubt(t, "acme", "m-role", "worker-role")
	recordVerify(t, b)
	waitKept(t, b, "acme", "m-role", 4)
	hc := &http.Client{Timeout: time.Minute}
	for path, want := range map[string]string{
		"/console/":                                            "<strong>1</strong> in doubt",
		"/console/reconcile/acme/m-role/" + auth:               "worker-role",
		"/console/mandates/acme/m-role":                        "worker-role",
		"/console/mandates/acme/m-role/history":                "report_unknown",
		"/console/authorizations/acme/m-role/" + auth:          "executor worker-role",
		"/console/search?q=" + auth:                            "executor worker-role", // followed to the authorization
		"/console/search?q=worker-role":                        "executor worker-role",
		"/console/overview":                                    "In doubt now",
		"/console/partitions":                                  "Outbox backlog",
		"/console/verify":                                      "Verified",
		"/v1/orgs/acme/mandates/m-role/authorizations/" + auth: "in_doubt",
	} {
		req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
		require.NoError(t, err)
		bearer := b.operator
		if strings.HasPrefix(path, "/v1/") {
			bearer = b.apiToken
		}
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
		require.Contains(t, string(body), want, path)
	}

	// A role the history was not granted to (a gateway role created
	// before migration 0051) is told what to grant.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := b.rw.Exec(ctx, "REVOKE SELECT ON decision_history FROM "+role)
	require.NoError(t, err)
	code, html := b.page(t, "/console/mandates/acme/m-role/history")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, html, "GRANT SELECT ON decision_history, decision_counts, decision_history_settings")
	code, html = b.page(t, "/console/mandates/acme/m-role")
	require.Equal(t, http.StatusOK, code, "the mandate's page stands without its latest decisions")
	require.Contains(t, html, "The decision history cannot be read now")
	_, err = b.rw.Exec(ctx, "GRANT SELECT ON decision_history TO "+role)
	require.NoError(t, err)

	// The role opens and ends console sessions (the one thing it writes).
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browserLike := &http.Client{Timeout: time.Minute, Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	postForm := func(path string, form url.Values) *http.Response {
		req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.base)
		resp, err := browserLike.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	login := postForm("/console/login", url.Values{"token": {b.operator}})
	require.Equal(t, http.StatusSeeOther, login.StatusCode, "the gateway's role opens a session")
	require.Equal(t, "/console/", login.Header.Get("Location"))
	logout := postForm("/console/logout", url.Values{"csrf": {csrfOf(t, b, browserLike)}})
	require.Equal(t, http.StatusSeeOther, logout.StatusCode, "the gateway's role ends a session")
	require.Equal(t, "/console/login", logout.Header.Get("Location"))
}

// gatewayRole creates a login role with exactly the grants of
// deploy/postgres/gateway-role.sql (as gateway/shards_test.go does) and
// returns its name and password; it is dropped at cleanup.
func gatewayRole(t *testing.T, dbURL string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	role, password := fmt.Sprintf("gw_console_%x", b), fmt.Sprintf("pw-%x", b)
	sqlFile, err := os.ReadFile(filepath.Join("..", "..", "deploy", "postgres", "gateway-role.sql"))
	require.NoError(t, err)
	var code []string
	for _, l := range strings.Split(string(sqlFile), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			code = append(code, l)
		}
	}
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if c, err := pgx.Connect(ctx, dbURL); err == nil {
			_, _ = c.Exec(ctx, "DROP OWNED BY "+role)
			_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
			c.Close(ctx)
		}
	})
	for _, stmt := range strings.Split(strings.Join(code, " "), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			_, err := admin.Exec(ctx, strings.ReplaceAll(stmt, "mandated_gateway", role))
			require.NoError(t, err, "%s", stmt)
		}
	}
	return role, password
}
