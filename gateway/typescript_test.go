package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/nodepkg"
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
	env := []string{"MANDATED_REQUIRE_GATEWAY=1", "MANDATED_REQUIRE_INSTALLED=1",
		"MANDATED_GATEWAY_URL=" + proxy.url, "MANDATED_GATEWAY_TOKEN=" + b.tokens["acme"], "MANDATED_GATEWAY_ORG=acme",
		"MANDATED_OTHER_TOKEN=" + b.tokens["globex"], "MANDATED_TEST_CONTROL_URL=" + control,
		"MANDATED_INTENT_VECTORS=" + filepath.Join(root, "wire", "testdata", "intent_keys.json")}

	nodepkg.Test(ctx, t, projects["langgraph-1.7"], env, "test/")
	nodepkg.Test(ctx, t, projects["langgraph-1.5"], env, "test/langgraph/")
	require.Empty(t, proxy.violations(), "exchanges of the TypeScript package that do not match the OpenAPI document")
	require.Greater(t, proxy.count(), 40, "the suite talked to the gateway")
}
