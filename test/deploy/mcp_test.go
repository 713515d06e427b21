package deploy

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
)

var (
	mcpFlagsOnce sync.Once
	mcpFlagSet   map[string]daemonFlag
	mcpFlagsErr  error
)

// mcpFlags parses the flags out of the built mandate-mcp's --help.
func mcpFlags(t testing.TB) map[string]daemonFlag {
	t.Helper()
	bin := binary(t, "mandate-mcp")
	mcpFlagsOnce.Do(func() { mcpFlagSet, mcpFlagsErr = helpFlags(bin) })
	require.NoError(t, mcpFlagsErr)
	require.Greater(t, len(mcpFlagSet), 10, "mandate-mcp --help lists its flags")
	return mcpFlagSet
}

// mandate-mcp's deployment against its flags: the compose service, its
// rules file, the Dockerfile target.
func TestMandateMCPManifests(t *testing.T) {
	t.Parallel()
	flags := mcpFlags(t)
	services := composeFile(t)["services"].(map[string]any)
	svc := services["mandate-mcp"]
	require.NotNil(t, svc, "the compose file has a mandate-mcp service")
	env := stringMap(t, dig(svc, "environment"), "mandate-mcp environment")

	t.Run("the service runs the binary, probed on --ops-addr's port, after the init job", func(t *testing.T) {
		require.Equal(t, []string{"/usr/local/bin/mandate-mcp"}, toStrings(dig(svc, "entrypoint")))
		for _, k := range []string{"MANDATED_RULES", "MANDATED_UPSTREAM_URL", "MANDATED_HTTP_ADDR", "MANDATED_OPS_ADDR"} {
			require.Contains(t, flagEnvNames(flags), k)
			require.NotEmpty(t, env[k], k)
		}
		ops := portOf(t, cmp(env["MANDATED_OPS_ADDR"], flags["ops-addr"].Default))
		require.NotEqual(t, portOf(t, env["MANDATED_HTTP_ADDR"]), ops)
		require.Contains(t, strings.Join(toStrings(dig(svc, "healthcheck", "test")), " "), "127.0.0.1:"+strconv.Itoa(ops)+"/readyz")
		require.Equal(t, "service_completed_successfully", str(dig(svc, "depends_on", "mandated-init", "condition")))
		require.Greater(t, parseDuration(t, str(dig(svc, "stop_grace_period"))), parseDuration(t, cmp(env["MANDATED_SHUTDOWN_TIMEOUT"], flags["shutdown-timeout"].Default)))
	})
	t.Run("the mounted rules file is valid", func(t *testing.T) {
		b, err := os.ReadFile(deployPath(t, "compose", "mcp-rules.yaml"))
		require.NoError(t, err)
		_, err = mcpguard.ParseRules(b)
		require.NoError(t, err)
		require.Contains(t, strings.Join(toStrings(dig(svc, "volumes")), "\n"), "./mcp-rules.yaml:"+env["MANDATED_RULES"])
	})
	t.Run("the Dockerfile builds it, has its target and lets its packages in", func(t *testing.T) {
		b, err := os.ReadFile(deployPath(t, "docker", "Dockerfile"))
		require.NoError(t, err)
		df := string(b)
		require.Contains(t, df, "./cmd/mandate-mcp")
		require.Contains(t, df, "FROM alpine:3.22 AS mandate-mcp")
		require.Contains(t, df, `ENTRYPOINT ["/usr/local/bin/mandate-mcp"]`)
		ignore, err := os.ReadFile(deployPath(t, "docker", "Dockerfile.dockerignore"))
		require.NoError(t, err)
		cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./cmd/mandate-mcp")
		cmd.Dir = root(t)
		out, err := cmd.Output()
		require.NoError(t, err)
		for _, pkg := range strings.Fields(string(out)) {
			if rel, ok := strings.CutPrefix(pkg, "github.com/mandated/mandated/"); ok {
				top, _, _ := strings.Cut(rel, "/")
				require.Contains(t, string(ignore), "!"+top+"/", "Dockerfile.dockerignore must let %s in", rel)
			}
		}
	})
}
