package langgraphjsapproval_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/nodepkg"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The seed's experiment (seeds/002) in its own stack: a LangGraph.js agent
// (the pinned @langchain/langgraph and its PostgreSQL checkpointer, npm ci
// from this directory's lockfile) with @mandated/client built from
// clients/typescript and installed as npm would; the example's `node --test`
// suite (approval.test.mjs) runs against a real gateway, processor, Kafka and
// PostgreSQL, the checkpointer and the ledger on a database of their own: 8
// resumes of one paused approval fired with Promise.allSettled and 8 resumer
// processes, unguarded (more than one refund) and guarded (one, every caller
// the recorded result), a time-travel replay, a denial, and the latency the
// guard adds to a resume. It fails, never skips, when node or npm is missing;
// MANDATED_TEST_NODE=skip skips it on purpose.
func TestLangGraphJSApprovalResumedConcurrentlyRefundsOnceOnlyWhenGuarded(t *testing.T) {
	t.Parallel()
	if os.Getenv("MANDATED_TEST_NODE") == "skip" {
		t.Skip("MANDATED_TEST_NODE=skip")
	}
	nodepkg.Tools(t)
	here, err := filepath.Abs(".")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := nodepkg.Project(ctx, t, here, nodepkg.Pack(ctx, t))

	st := startStack(t)
	out := nodepkg.Test(ctx, t, dir, []string{
		"MANDATED_GATEWAY_URL=" + st.base, "MANDATED_GATEWAY_TOKEN=" + st.token, "MANDATED_GATEWAY_ORG=acme",
		"MANDATED_TEST_CONTROL_URL=" + st.control, "LANGGRAPH_TEST_DSN=" + testenv.Database(t),
	}, "approval.test.mjs")
	for _, line := range regexp.MustCompile(`(?m)^# (EXPERIMENT|LATENCY) .*$`).FindAllString(out, -1) {
		t.Log(line[2:])
	}
}

type stack struct {
	base, token, control string
}

// startStack runs what a LangGraph.js deployment talks to: a processor on
// real Kafka and PostgreSQL, a gateway, and a control plane that grants
// mandates (as a grantor would).
func startStack(t *testing.T) stack {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rw, err := pgx.Connect(ctx, h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(func() { rw.Close(context.Background()) })
	_, err = sink.Migrate(ctx, rw)
	require.NoError(t, err)
	h.Start("a")
	_, token, err := gateway.CreateToken(ctx, rw, "acme", "langgraphjs example")
	require.NoError(t, err)

	pcfg, err := pgxpool.ParseConfig(h.DatabaseURL)
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	cl, err := client.New(ctx, client.Config{Brokers: h.Brokers, KafkaOpts: h.KafkaOpts,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions,
		FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	srv, err := gateway.New(gateway.Config{}, cl, pool, prometheus.NewRegistry())
	require.NoError(t, err)
	base := serve(t, func(ln net.Listener) func(context.Context) error {
		hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
		go func() { _ = srv.Serve(hs, ln) }()
		return hs.Shutdown
	})

	grants := http.NewServeMux()
	grants.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			MandateID               string `json:"mandate_id"`
			Uses                    int64  `json:"uses"`
			ExecutionTimeoutSeconds int64  `json:"execution_timeout_seconds"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 45*time.Second)
		defer cancel()
		d, err := cl.Grant(ctx, client.Grant{Ref: client.Ref{Org: "acme", MandateID: in.MandateID}, Uses: in.Uses,
			MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"},
			ExecutionTimeoutSeconds: in.ExecutionTimeoutSeconds})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(d.Raw)
	})
	control := serve(t, func(ln net.Listener) func(context.Context) error {
		hs := &http.Server{Handler: grants, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		return hs.Shutdown
	})
	return stack{base: base, token: token, control: control + "/"}
}

// serve listens on a free local port, starts a server there and stops it at
// cleanup; it returns the base URL.
func serve(t *testing.T, start func(net.Listener) func(context.Context) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	shutdown := start(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}
