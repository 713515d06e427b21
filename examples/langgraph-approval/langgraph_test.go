package langgraphapproval_test

import (
	"context"
	"encoding/json"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/gateway/console"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestMain(m *testing.M) {
	testenv.SkipPackageInShortTier("pip-installs LangGraph and runs the example's pytest suite against the real stack")
	goleak.VerifyTestMain(m)
}

// The seed's experiment (seeds/002) with a real LangGraph agent: the pinned
// langgraph and langgraph-checkpoint-postgres are pip-installed with
// clients/python's [langgraph] extra into a virtual environment, and the
// example's pytest suite (test_approval.py) runs against a real gateway,
// processor, Kafka and PostgreSQL, the checkpointer and the ledger on a
// database of their own: 8 threads and 8 processes resume one paused
// approval, unguarded (more than one refund) and guarded (one), the restored
// and forked agent, a denial, a resumer killed between begin and commit, and
// the latency the guard adds to a resume. It fails, never skips, when
// python3, venv or pip is missing (test/infra/run-tests.sh installs them);
// MANDATED_TEST_PYTHON=skip skips it on purpose.
func TestLangGraphApprovalResumedConcurrentlyRefundsOnceOnlyWhenGuarded(t *testing.T) {
	t.Parallel()
	if os.Getenv("MANDATED_TEST_PYTHON") == "skip" {
		t.Skip("MANDATED_TEST_PYTHON=skip")
	}
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 is required (test/infra/run-tests.sh installs it; MANDATED_TEST_PYTHON=skip to skip)")
	here, err := filepath.Abs(".")
	require.NoError(t, err)
	pkgDir := filepath.Join(here, "..", "..", "clients", "python")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel) // after the parallel subtests, not when this function returns
	st := startStack(t)
	env := append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1",
		"MANDATED_GATEWAY_URL="+st.base, "MANDATED_GATEWAY_TOKEN="+st.token, "MANDATED_GATEWAY_ORG=acme",
		"MANDATED_TEST_CONTROL_URL="+st.control,
		"MANDATED_OPERATOR_TOKEN="+st.operatorToken)
	k := os.Getenv("MANDATED_TEST_PYTEST_K") // a developer's subset: `MANDATED_TEST_PYTEST_K=intent go test ...`

	// The pinned langgraph (the [langgraph] extra) runs the whole suite; the
	// previous minor runs the intent model's tests (test_facts.py: the facts
	// against LangGraph alone; test_intents.py: through the gateway), side by
	// side on the same stack, each with a database of its own for its
	// checkpointer and ledger: two suites setting up one database at once
	// raced in CREATE TABLE IF NOT EXISTS (CI: UniqueViolation on
	// pg_type_typname_nsp_index, "Key (typname, typnamespace)=(ledger, 2200)
	// already exists"), and two checkpointer versions should not share their
	// tables anyway.
	t.Run("pinned", func(t *testing.T) {
		t.Parallel()
		venv := installWithLangGraph(ctx, t, py, pkgDir, nil)
		runPytest(ctx, t, venv, here, withLangGraphDatabase(t, env), k, here)
	})
	t.Run("langgraph "+previousLangGraph, func(t *testing.T) {
		t.Parallel()
		if k != "" {
			t.Skip("MANDATED_TEST_PYTEST_K: the pinned langgraph only")
		}
		venv := installWithLangGraph(ctx, t, py, pkgDir, previousLangGraphPackages)
		runPytest(ctx, t, venv, here, withLangGraphDatabase(t, env), "", filepath.Join(here, "test_facts.py"), filepath.Join(here, "test_intents.py"))
	})
}

// The previous minor of langgraph, whose intent-model tests run beside the
// pinned one's (clients/python/pyproject.toml pins the current one).
const previousLangGraph = "1.1.10"

var previousLangGraphPackages = []string{"langgraph==" + previousLangGraph, "langgraph-checkpoint-postgres==3.2.0",
	"psycopg[binary]>=3.3,<3.4", "psycopg-pool>=3.2,<4"}

// runPytest runs pytest on paths in the example's directory and requires every
// test to pass (none skipped); it logs the figures the suite prints.
func runPytest(ctx context.Context, t *testing.T, venv, here string, env []string, k string, paths ...string) {
	t.Helper()
	args := append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "-rfEs"}, paths...)
	if k != "" {
		args = append(args, "-k", k)
	}
	cmd := exec.CommandContext(ctx, venv, args...)
	cmd.Dir = here
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	for _, line := range regexp.MustCompile(`(?m)^(EXPERIMENT|LATENCY|INTENT|ASYNC|INPROGRESS|RECORDED) .*$`).FindAllString(string(out), -1) {
		t.Log(line)
	}
	require.NoError(t, err, "pytest failed")
	summary := `(?m)^\d+ passed in `
	if k != "" {
		summary = `(?m)^\d+ passed(, \d+ deselected)? in `
	}
	require.Regexp(t, summary, lastLine(string(out)), "every test passed and none was skipped")
}

// installWithLangGraph makes a virtual environment (seeing the system's
// site-packages, for pytest) and pip-installs a copy of clients/python with
// its [langgraph] extra (the pinned packages from PyPI, through pip's cache
// so a second run downloads nothing) or, when packages are given, without
// the extra and with those; it returns the environment's python.
func installWithLangGraph(ctx context.Context, t *testing.T, py, pkgDir string, packages []string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	// A copy of the package without a developer's venvs, caches and builds.
	require.NoError(t, filepath.WalkDir(pkgDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(pkgDir, path)
		base := d.Name()
		if rel != "." && (base == "build" || base == "__pycache__" || strings.HasPrefix(base, ".venv") ||
			strings.HasSuffix(base, "_cache") || strings.HasSuffix(base, ".egg-info")) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(src, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(src, rel), b, 0o644)
	}))
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	run := func(name string, args ...string) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1",
			"PIP_CACHE_DIR="+filepath.Join(cache, "mandated-pip"))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	}
	run(py, "-m", "venv", "--system-site-packages", filepath.Join(dir, "venv"))
	venv := filepath.Join(dir, "venv", "bin", "python")
	run(venv, "-c", "import pytest") // pytest comes from the system (run-tests.sh installs it when missing)
	start := time.Now()
	if packages == nil {
		run(venv, "-m", "pip", "install", "--quiet", src+"[langgraph]")
	} else {
		run(venv, append([]string{"-m", "pip", "install", "--quiet", src}, packages...)...)
	}
	t.Logf("pip install clients/python %v: %s", packages, time.Since(start).Round(time.Millisecond))
	return venv
}

type stack struct {
	base, token, operatorToken, control string
}

// startStack runs what a LangGraph deployment talks to: a processor on real
// Kafka and PostgreSQL, a gateway, a control plane that grants mandates (as
// a grantor would); each suite adds a database of its own for the
// checkpointer and the ledger (withLangGraphDatabase).
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
	_, token, err := gateway.CreateToken(ctx, rw, "acme", "langgraph example")
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
	// The operators' console beside the API, as mandate-gateway --console
	// mounts it: the kill -9 test reads its in-doubt queue.
	control, err := pgxpool.New(ctx, h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(control.Close)
	con, err := console.New(console.Config{}, console.Sources{Client: cl, Control: control,
		Operator: func() *sink.Operator { return sink.NewOperator(pool) }})
	require.NoError(t, err)
	con.Register(srv.Mux())
	_, operatorToken, err := gateway.CreateOperatorToken(ctx, rw, "langgraph example")
	require.NoError(t, err)
	base := serve(t, func(ln net.Listener) (func(context.Context) error, error) {
		hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
		go func() { _ = srv.Serve(hs, ln) }()
		return hs.Shutdown, nil
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
	grantsURL := serve(t, func(ln net.Listener) (func(context.Context) error, error) {
		hs := &http.Server{Handler: grants, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		return hs.Shutdown, nil
	})
	return stack{base: base, token: token, operatorToken: operatorToken, control: grantsURL + "/"}
}

// serve listens on a free local port, starts a server there and stops it
// at cleanup; it returns the base URL.
func serve(t *testing.T, start func(net.Listener) (func(context.Context) error, error)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	shutdown, err := start(ln)
	require.NoError(t, err)
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = shutdown(ctx)
		})
	})
	return "http://" + ln.Addr().String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// langgraphDatabase is the checkpointer's and the ledger's database, apart
// from mandated's.
func langgraphDatabase(t *testing.T) string {
	t.Helper()
	return testenv.Database(t)
}

// withLangGraphDatabase returns env with LANGGRAPH_TEST_DSN set to a new
// database of t's own (dropped when t ends).
func withLangGraphDatabase(t *testing.T, env []string) []string {
	t.Helper()
	return append(slices.Clip(env), "LANGGRAPH_TEST_DSN="+langgraphDatabase(t))
}
