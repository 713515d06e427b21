package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	validator "github.com/pb33f/libopenapi-validator"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// The Python package (clients/python) against a real gateway, processor,
// Kafka and PostgreSQL: it is installed with pip into a virtual environment
// (from a copy of its directory, as `pip install ./clients/python` would),
// and its pytest suite runs with the installed package, talking to the
// gateway through a proxy that checks every exchange against the OpenAPI
// document. Mandates come from a control plane the test serves
// (MANDATED_TEST_CONTROL_URL: grants through the Go client). It fails, never
// skips, when python3, venv, pip or pytest is missing (test/infra/run-tests.sh
// installs them); MANDATED_TEST_PYTHON=skip skips it on purpose.
func TestPythonPackage(t *testing.T) {
	t.Parallel()
	testenv.SkipInShortTier(t, "pip-installs the Python package, ruff and mypy into a virtual environment and runs its pytest suite")
	if os.Getenv("MANDATED_TEST_PYTHON") == "skip" {
		t.Skip("MANDATED_TEST_PYTHON=skip")
	}
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 is required (test/infra/run-tests.sh installs it; MANDATED_TEST_PYTHON=skip to skip)")
	pkgDir, err := filepath.Abs(filepath.Join("..", "clients", "python"))
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mandatectl := buildMandatectl(t)
	venv := installPythonPackage(ctx, t, py, pkgDir)
	lintPythonPackage(ctx, t, venv, pkgDir)

	b := setup(t, options{startProcessor: true})
	other := b.tokens["globex"]
	proxy := newValidatingProxy(t, b.base, b.spec)
	control := serveControlPlane(t, b)
	sigs := newSignatureFixtures(ctx, t, b, mandatectl)

	cmd := exec.CommandContext(ctx, venv, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", filepath.Join(pkgDir, "tests"))
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "MANDATED_REQUIRE_GATEWAY=1", "MANDATED_REQUIRE_INSTALLED=1",
		"MANDATED_GATEWAY_URL="+proxy.url, "MANDATED_GATEWAY_TOKEN="+b.tokens["acme"], "MANDATED_GATEWAY_ORG=acme",
		"MANDATED_OTHER_TOKEN="+other, "MANDATED_TEST_CONTROL_URL="+control)
	cmd.Env = append(cmd.Env, sigs.env()...)
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	require.NoError(t, err, "pytest failed")
	summary := lastLine(string(out))
	require.Regexp(t, `^\d+ passed in `, summary, "every test passed and none was skipped")
	require.Empty(t, proxy.violations(), "exchanges of the Python package that do not match the OpenAPI document")
	require.Empty(t, sigs.unchecked.violations(), "exchanges with the gateway that does not check signatures that do not match the OpenAPI document")
	require.Greater(t, proxy.count(), 40, "the suite talked to the gateway")
}

// The linters' versions, pinned: a new release's new rules are a change of
// their own.
const (
	ruffVersion = "0.17.6"
	mypyVersion = "2.4.1"
)

// lintPythonPackage installs ruff and mypy from PyPI into the test's virtual
// environment (through pip's cache) and runs them as clients/python's
// pyproject.toml configures them: `ruff check` over the package, its tests
// and the LangGraph example; `mypy --strict` over the package.
func lintPythonPackage(ctx context.Context, t *testing.T, venv, pkgDir string) {
	t.Helper()
	run := func(dir, name string, args ...string) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1",
			"PIP_CACHE_DIR="+pipCache(), "RUFF_NO_CACHE=true", "MYPY_CACHE_DIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	}
	run(pkgDir, venv, "-m", "pip", "install", "--quiet", "ruff=="+ruffVersion, "mypy=="+mypyVersion)
	examples := filepath.Join(pkgDir, "..", "..", "examples")
	run(pkgDir, venv, "-m", "ruff", "check", "--no-cache", "--config", "pyproject.toml", "src", "tests",
		filepath.Join(examples, "langgraph-approval"), filepath.Join(examples, "langgraph_quickstart.py"))
	run(pkgDir, venv, "-m", "mypy", "--strict")
}

func pipCache() string {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "mandated-pip")
}

// installPythonPackage makes a virtual environment (seeing the system's
// site-packages, for pytest) and pip-installs a copy of the package into it;
// it returns the environment's python.
func installPythonPackage(ctx context.Context, t *testing.T, py, pkgDir string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	require.NoError(t, copyTree(pkgDir, src, func(rel string) bool {
		base := filepath.Base(rel)
		return base == "__pycache__" || base == "build" || strings.HasSuffix(base, ".egg-info") ||
			strings.HasPrefix(base, ".venv") || strings.HasSuffix(base, "_cache") // a developer's venvs and caches
	}))
	run := func(name string, args ...string) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	}
	run(py, "-m", "venv", "--system-site-packages", filepath.Join(dir, "venv"))
	venv := filepath.Join(dir, "venv", "bin", "python")
	run(venv, "-c", "import pytest") // pytest comes from the system (run-tests.sh installs it when missing)
	run(venv, "-m", "pip", "install", "--quiet", src)
	return venv
}

func copyTree(from, to string, skip func(rel string) bool) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if rel != "." && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// serveControlPlane serves the Python tests' grants: POST {"mandate_id",
// "uses", "hold_seconds", "execution_timeout_seconds"} grants the mandate
// on the grants topic (as a grantor would) and answers with the decision.
func serveControlPlane(t *testing.T, b *testBundle) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := client.New(ctx, client.Config{Brokers: b.h.Brokers, KafkaOpts: b.h.KafkaOpts,
		ProposalsTopic: b.h.Spec.Proposals, GrantsTopic: b.h.Spec.Grants, DecisionsTopic: b.h.Spec.Decisions,
		FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			MandateID               string `json:"mandate_id"`
			Uses                    int64  `json:"uses"`
			HoldSeconds             int64  `json:"hold_seconds"`
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
			HoldSeconds: in.HoldSeconds, ExecutionTimeoutSeconds: in.ExecutionTimeoutSeconds})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(d.Raw)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		cl.Close()
	})
	return "http://" + ln.Addr().String() + "/"
}

// validatingProxy forwards to a gateway and checks every exchange against
// the OpenAPI document (libopenapi-validator), keeping what does not match.
type validatingProxy struct {
	url string

	mu    sync.Mutex
	bad   []string
	n     int
	specM *sync.Mutex
}

type bodyKey struct{}

func newValidatingProxy(t *testing.T, target string, spec validator.Validator) *validatingProxy {
	t.Helper()
	to, err := url.Parse(target)
	require.NoError(t, err)
	p := &validatingProxy{specM: &sync.Mutex{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(to)
			pr.Out.Host = pr.In.Host
		},
		ModifyResponse: func(resp *http.Response) error {
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(bytes.NewReader(body))
			in := resp.Request
			reqBody, _ := in.Context().Value(bodyKey{}).([]byte)
			check, err := http.NewRequest(in.Method, target+in.URL.RequestURI(), bytes.NewReader(reqBody))
			if err != nil {
				return err
			}
			check.Header = in.Header.Clone()
			copyResp := *resp
			copyResp.Body = io.NopCloser(bytes.NewReader(body))
			p.specM.Lock()
			var ok bool
			var verrs []*verrors.ValidationError
			if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusRequestEntityTooLarge {
				// The request broke the contract on purpose (the suite's invalid
				// commands): its answer must still be the documented problem.
				ok, verrs = spec.ValidateHttpResponse(check, &copyResp)
			} else {
				ok, verrs = spec.ValidateHttpRequestResponse(check, &copyResp)
			}
			p.specM.Unlock()
			p.mu.Lock()
			defer p.mu.Unlock()
			p.n++
			if !ok {
				var msgs []string
				for _, e := range verrs {
					msgs = append(msgs, e.Message+": "+e.Reason)
				}
				p.bad = append(p.bad, fmt.Sprintf("%s %s -> %d %s: %v", in.Method, in.URL.Path, resp.StatusCode, body, msgs))
			}
			return nil
		},
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if len(body) == 0 {
			r.Body, r.ContentLength = http.NoBody, 0
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bodyKey{}, body)))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	p.url = "http://" + ln.Addr().String()
	return p
}

func (p *validatingProxy) violations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.bad...)
}

func (p *validatingProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
