package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/nodepkg"
	"github.com/mandated/mandated/test/testenv"
)

// The TypeScript package (clients/typescript, npm @mandated/client) against a
// real gateway, processor, Kafka and PostgreSQL: it is built with the
// TypeScript compiler from its committed lockfile (npm ci), packed as npm
// would publish it and installed into a project that pins its LangGraph.js
// peers (clients/typescript/peers/langgraph-1.7); its `node --test` suite
// then runs with the installed package: the unit tests (typed errors, the
// intent keys' golden vectors, retries that keep the key, aborts), the
// integration tests through a proxy that checks every exchange against the
// OpenAPI document, and the LangGraph.js guard's tests. The guard's tests run
// again with the previous minor of @langchain/langgraph
// (peers/langgraph-1.5). It fails, never skips, when node or npm is missing;
// MANDATED_TEST_NODE=skip skips it on purpose.
func TestTypeScriptPackage(t *testing.T) {
	t.Parallel()
	if os.Getenv("MANDATED_TEST_NODE") == "skip" {
		t.Skip("MANDATED_TEST_NODE=skip")
	}
	nodepkg.Tools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mandatectl := buildMandatectl(t)
	root := nodepkg.Root(t)
	pkgDir := filepath.Join(root, "clients", "typescript")
	tarball := nodepkg.Pack(ctx, t)
	projects := map[string]string{}
	for _, peers := range []string{"langgraph-1.7", "langgraph-1.5"} {
		dir := nodepkg.Project(ctx, t, filepath.Join(pkgDir, "peers", peers), tarball)
		require.NoError(t, nodepkg.CopyTree(filepath.Join(pkgDir, "test"), filepath.Join(dir, "test"), nil))
		projects[peers] = dir
	}

	b := setup(t, options{startProcessor: true})
	proxy := newValidatingProxy(t, b.base, b.spec)
	control := serveControlPlane(t, b)
	sigs := newSignatureFixtures(ctx, t, b, mandatectl)
	env := []string{"MANDATED_REQUIRE_GATEWAY=1", "MANDATED_REQUIRE_INSTALLED=1",
		"MANDATED_GATEWAY_URL=" + proxy.url, "MANDATED_GATEWAY_TOKEN=" + b.tokens["acme"], "MANDATED_GATEWAY_ORG=acme",
		"MANDATED_OTHER_TOKEN=" + b.tokens["globex"], "MANDATED_TEST_CONTROL_URL=" + control,
		"MANDATED_INTENT_VECTORS=" + filepath.Join(root, "wire", "testdata", "intent_keys.json"),
		"MANDATED_SIGNATURE_VECTORS=" + filepath.Join(root, "wire", "testdata", "decision_signatures.json"),
		"LANGGRAPH_TEST_DSN=" + testenv.Database(t)} // the guard's tests: the checkpointer and their ledger

	current, previous := []string{"test/*.test.mjs", "test/langgraph/*.test.mjs"}, []string{"test/langgraph/*.test.mjs"}
	if only := os.Getenv("MANDATED_TEST_NODE_ONLY"); only != "" { // a developer's shortcut: these files alone
		current, previous = strings.Fields(only), strings.Fields(only)
	}
	env = append(env, sigs.env()...)
	nodepkg.Test(ctx, t, projects["langgraph-1.7"], env, testFiles(t, pkgDir, current...)...)
	nodepkg.Test(ctx, t, projects["langgraph-1.5"], env, testFiles(t, pkgDir, previous...)...)
	// Decision signatures, alone: the forgery holds the processor a moment.
	nodepkg.Test(ctx, t, projects["langgraph-1.7"], env, testFiles(t, pkgDir, "test/signatures/*.test.mjs")...)
	require.Empty(t, proxy.violations(), "exchanges of the TypeScript package that do not match the OpenAPI document")
	require.Empty(t, sigs.unchecked.violations(), "exchanges with the gateway that does not check signatures that do not match the OpenAPI document")
	if os.Getenv("MANDATED_TEST_NODE_ONLY") != "" {
		return
	}
	require.Greater(t, proxy.count(), 40, "the suite talked to the gateway")

	// The README's TypeScript block is examples/quickstart.mjs, byte for byte,
	// and runs as written: it spends refund-case-1844 (make dev grants it), and
	// a second run (another worker) prints the same, the recorded result.
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	quickstart, err := os.ReadFile(filepath.Join(root, "examples", "quickstart.mjs"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?ms)^```js\n(.*?)^```\n").FindAllStringSubmatch(string(readme), -1)
	require.Len(t, m, 1, "README.md has one ```js block")
	require.Equal(t, string(quickstart), m[0][1], "the README's TypeScript block is examples/quickstart.mjs")
	grantMandate(t, control, "refund-case-1844")
	dir := projects["langgraph-1.7"]
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "examples"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "examples", "quickstart.mjs"), quickstart, 0o644))
	node, _ := nodepkg.Tools(t)
	qsEnv := []string{"MANDATED_GATEWAY_URL=" + b.base, "MANDATED_GATEWAY_TOKEN=" + b.tokens["acme"]}
	first := nodepkg.Run(ctx, t, dir, qsEnv, node, "examples/quickstart.mjs")
	require.Regexp(t, `^reserved\nre_\S{12} \{"status":"succeeded"\}\n$`, first)
	again := nodepkg.Run(ctx, t, dir, qsEnv, node, "examples/quickstart.mjs")
	require.Equal(t, first, again, "a second run of the block gets the winner's recorded result")
}

// testFiles lists the test files the patterns match under dir, relative to it.
func testFiles(t *testing.T, dir string, patterns ...string) []string {
	t.Helper()
	var files []string
	for _, p := range patterns {
		m, err := filepath.Glob(filepath.Join(dir, p))
		require.NoError(t, err)
		for _, f := range m {
			rel, err := filepath.Rel(dir, f)
			require.NoError(t, err)
			files = append(files, rel)
		}
	}
	require.NotEmpty(t, files, "no test files match %v in %s", patterns, dir)
	return files
}

// grantMandate grants mandateID through the test's control plane.
func grantMandate(t *testing.T, control, mandateID string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"mandate_id": mandateID, "uses": 1})
	require.NoError(t, err)
	resp, err := http.Post(control, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var d struct {
		Outcome string `json:"outcome"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
	require.Equal(t, "granted", d.Outcome)
}
