package mcpguard_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/nodepkg"
	"github.com/mandated/mandated/test/procs"
)

// The real MCP SDKs the tests run as upstreams and agents, installed from
// PyPI and npm by the tests themselves (a fresh machine has only python3 and
// node): each Python SDK into a virtual environment, the TypeScript SDKs
// with npm ci from testdata/node's committed lockfile. Both are kept in the
// user's cache directory, keyed by what was installed, so a second run
// installs nothing; pip's and npm's caches make a reinstall cheap.
const (
	pythonSDKCurrent  = "mcp==2.3.0"  // PyPI's newest (MCPServer, protocol 2026-07-28)
	pythonSDKPrevious = "mcp==1.30.0" // the last of the previous major (FastMCP, protocol 2025-11-25)
	tsSDKCurrent      = "1.32.2"      // npm's newest @modelcontextprotocol/sdk (testdata/node/package.json)
	tsSDKPrevious     = "1.31.0"      // the previous release, installed as mcp-sdk-previous
)

var (
	installMu sync.Mutex // one install of a kind at a time in this test binary
	installed = map[string]string{}
)

func cacheDir(t *testing.T) string {
	t.Helper()
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "mandated-test")
}

// requirePython fails (never skips) without python3; MANDATED_TEST_PYTHON=skip
// skips on purpose.
func requirePython(t *testing.T) string {
	t.Helper()
	if os.Getenv("MANDATED_TEST_PYTHON") == "skip" {
		t.Skip("MANDATED_TEST_PYTHON=skip")
	}
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 is required (test/infra/run-tests.sh installs it; MANDATED_TEST_PYTHON=skip to skip)")
	return py
}

// pythonSDK returns the python of a virtual environment holding the Python
// MCP SDK spec (e.g. "mcp==2.3.0").
func pythonSDK(t *testing.T, spec string) string {
	t.Helper()
	py := requirePython(t)
	installMu.Lock()
	defer installMu.Unlock()
	if p, ok := installed[spec]; ok {
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cache := cacheDir(t)
	dir := filepath.Join(cache, "venv-"+strings.NewReplacer("=", "-", ".", "-").Replace(spec))
	venv := filepath.Join(dir, "bin", "python")
	probe := "import mcp.client.streamable_http, mcp.server.stdio, uvicorn"
	if exec.CommandContext(ctx, venv, "-c", probe).Run() != nil {
		start := time.Now()
		// Built beside and renamed into place: another test process never
		// sees half an environment.
		tmp := fmt.Sprintf("%s.tmp-%d", dir, os.Getpid())
		_ = os.RemoveAll(tmp)
		run := func(name string, args ...string) {
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PYTHONDONTWRITEBYTECODE=1",
				"PIP_CACHE_DIR="+filepath.Join(cache, "..", "mandated-pip"))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
		}
		run(py, "-m", "venv", tmp)
		run(filepath.Join(tmp, "bin", "python"), "-m", "pip", "install", "--quiet", spec)
		_ = os.RemoveAll(dir)
		if err := os.Rename(tmp, dir); err != nil {
			_ = os.RemoveAll(tmp)
		}
		require.NoError(t, exec.CommandContext(ctx, venv, "-c", probe).Run(), "the environment of %s does not import", spec)
		t.Logf("pip install %s: %s", spec, time.Since(start).Round(time.Millisecond))
	}
	installed[spec] = venv
	return venv
}

// nodeSDK returns a directory holding testdata/node's scripts beside a
// node_modules installed with npm ci from its lockfile.
func nodeSDK(t *testing.T) string {
	t.Helper()
	if os.Getenv("MANDATED_TEST_NODE") == "skip" {
		t.Skip("MANDATED_TEST_NODE=skip")
	}
	nodepkg.Tools(t) // node ≥ 20.3 and npm, or the test fails
	src, err := filepath.Abs(filepath.Join("testdata", "node"))
	require.NoError(t, err)
	installMu.Lock()
	modules, ok := installed["node"]
	if !ok {
		modules = npmCI(t, src)
		installed["node"] = modules
	}
	installMu.Unlock()
	// The scripts are copied per test (they are read from here), beside a
	// link to the shared node_modules, where node resolves their imports.
	dir := t.TempDir()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".mjs") || e.Name() == "package.json" {
			b, err := os.ReadFile(filepath.Join(src, e.Name()))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600))
		}
	}
	require.NoError(t, os.Symlink(modules, filepath.Join(dir, "node_modules")))
	return dir
}

func npmCI(t *testing.T, src string) string {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(src, "package-lock.json"))
	require.NoError(t, err)
	pkg, err := os.ReadFile(filepath.Join(src, "package.json"))
	require.NoError(t, err)
	sum := sha256.Sum256(append(lock, pkg...))
	cache := cacheDir(t)
	dir := filepath.Join(cache, "node-"+hex.EncodeToString(sum[:8]))
	modules := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(modules, ".package-lock.json")); err == nil {
		return modules
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	tmp := fmt.Sprintf("%s.tmp-%d", dir, os.Getpid())
	_ = os.RemoveAll(tmp)
	require.NoError(t, os.MkdirAll(tmp, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "package-lock.json"), lock, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(tmp, "package.json"), pkg, 0o600))
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel", "error",
		"--cache", filepath.Join(cache, "..", "mandated-npm"))
	cmd.Dir = tmp
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm ci:\n%s", out)
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		_ = os.RemoveAll(tmp)
	}
	_, err = os.Stat(filepath.Join(modules, ".package-lock.json"))
	require.NoError(t, err, "npm ci left no node_modules")
	t.Logf("npm ci (@modelcontextprotocol/sdk %s and %s): %s", tsSDKCurrent, tsSDKPrevious, time.Since(start).Round(time.Millisecond))
	return modules
}

// waitListening waits until a process of ours accepts connections on port.
func waitListening(t *testing.T, p *procs.Process, port int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if p.Exited() {
			t.Fatalf("%s exited before it listened:\n%s", p.Name, p.Log())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not listen on %d after 60s:\n%s", p.Name, port, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fileLedger is the ledger file an upstream of another language appends
// one JSON line to per refund that ran.
type fileLedger string

func newFileLedger(t *testing.T) fileLedger {
	return fileLedger(filepath.Join(t.TempDir(), "ledger.jsonl"))
}

// count is how many refunds of orderID ran.
func (l fileLedger) count(t *testing.T, orderID string) int {
	t.Helper()
	return len(l.pids(t, orderID))
}

// pids are the process ids of the upstream that ran each refund of orderID
// (0 where the upstream does not write its own).
func (l fileLedger) pids(t *testing.T, orderID string) []int {
	t.Helper()
	f, err := os.Open(string(l))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var out []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			OrderID string `json:"order_id"`
			PID     int    `json:"pid"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "%s", sc.Bytes())
		if line.OrderID == orderID {
			out = append(out, line.PID)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// lockedWriter is an io.Writer a process's output goroutine and the test
// may share.
type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}
