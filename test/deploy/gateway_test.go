package deploy

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/testenv"
)

// The gateway's manifests against its flags and routes: deploy/kubernetes/
// gateway, the compose service, the Prometheus job.
func TestGatewayManifests(t *testing.T) {
	t.Parallel()
	flags := gatewayFlags(t)
	objs := map[string][]map[string]any{}
	files, err := filepath.Glob(deployPath(t, "kubernetes", "gateway", "*.yaml"))
	require.NoError(t, err)
	for _, f := range files {
		for _, d := range yamlDocs(t, f) {
			objs[str(d["kind"])] = append(objs[str(d["kind"])], d)
		}
	}
	kust := yamlDocs(t, deployPath(t, "kubernetes", "kustomization.yaml"))[0]
	require.Contains(t, toStrings(kust["resources"]), "gateway", "the top-level kustomization includes the gateway")

	cm := stringMap(t, one(t, objs, "ConfigMap")["data"], "gateway ConfigMap data")
	secret := stringMap(t, one(t, objs, "Secret")["stringData"], "gateway Secret stringData")
	dep := one(t, objs, "Deployment")
	pod := dig(dep, "spec", "template", "spec")
	c := dig(pod, "containers", 0)
	port := portOf(t, cmp(cm["MANDATED_HTTP_ADDR"], flags["http-addr"].Default))
	opsPort := portOf(t, cmp(cm["MANDATED_OPS_ADDR"], flags["ops-addr"].Default))
	shutdown := parseDuration(t, cmp(cm["MANDATED_SHUTDOWN_TIMEOUT"], flags["shutdown-timeout"].Default))
	maxWait := parseDuration(t, cmp(cm["MANDATED_MAX_WAIT"], flags["max-wait"].Default))

	t.Run("the ConfigMap and the Secret hold only gateway flags, secrets only in the Secret", func(t *testing.T) {
		for k := range cm {
			require.Contains(t, flagEnvNames(flags), k)
			require.NotRegexp(t, `PASSWORD|DATABASE_URL$`, k)
		}
		for k, v := range secret {
			require.Contains(t, flagEnvNames(flags), k)
			require.Contains(t, v, "REPLACE_ME")
		}
	})
	t.Run("the Deployment runs the gateway binary, the API on --http-addr's port, probes and metrics on --ops-addr's", func(t *testing.T) {
		require.Equal(t, []string{"/usr/local/bin/mandate-gateway"}, toStrings(dig(c, "command")))
		require.NotEqual(t, port, opsPort, "the operations endpoints have a listener of their own")
		ports := map[string]any{}
		for _, p := range dig(c, "ports").([]any) {
			ports[str(dig(p, "name"))] = dig(p, "containerPort")
		}
		require.Equal(t, map[string]any{"http": port, "ops": opsPort}, ports)
		require.Equal(t, "/readyz", str(dig(c, "readinessProbe", "httpGet", "path")))
		require.Equal(t, "ops", str(dig(c, "readinessProbe", "httpGet", "port")))
		require.Equal(t, "/healthz", str(dig(c, "livenessProbe", "httpGet", "path")))
		require.Equal(t, "ops", str(dig(c, "livenessProbe", "httpGet", "port")))
		require.Equal(t, fmt.Sprint(opsPort), str(dig(dep, "spec", "template", "metadata", "annotations", "prometheus.io/port")))
		require.Equal(t, port, dig(one(t, objs, "Service"), "spec", "ports", 0, "port"), "the Service exposes the API only")
		require.Len(t, dig(one(t, objs, "Service"), "spec", "ports"), 1)
	})
	t.Run("requests waiting for a decision finish before SIGKILL", func(t *testing.T) {
		grace := time.Duration(dig(pod, "terminationGracePeriodSeconds").(int)) * time.Second
		require.Greater(t, shutdown, maxWait, "MANDATED_SHUTDOWN_TIMEOUT must exceed MANDATED_MAX_WAIT")
		require.Greater(t, grace, shutdown)
	})
	t.Run("the Service and the PodDisruptionBudget select the gateway's pods", func(t *testing.T) {
		sel := dig(dep, "spec", "selector", "matchLabels")
		require.Equal(t, sel, dig(one(t, objs, "Service"), "spec", "selector"))
		require.Equal(t, sel, dig(one(t, objs, "PodDisruptionBudget"), "spec", "selector", "matchLabels"))
	})
	t.Run("compose runs the gateway after the init job and Prometheus scrapes it", func(t *testing.T) {
		compose := composeFile(t)
		gw := dig(compose, "services", "gateway")
		require.NotNil(t, gw)
		require.Equal(t, []string{"/usr/local/bin/mandate-gateway"}, toStrings(dig(gw, "entrypoint")))
		env := stringMap(t, dig(gw, "environment"), "gateway environment")
		gport := portOf(t, cmp(env["MANDATED_OPS_ADDR"], flags["ops-addr"].Default))
		require.Contains(t, strings.Join(toStrings(dig(gw, "healthcheck", "test")), " "), fmt.Sprintf("http://127.0.0.1:%d/readyz", gport))
		require.Equal(t, "service_completed_successfully", str(dig(gw, "depends_on", "mandated-init", "condition")))
		prom := yamlDocs(t, deployPath(t, "prometheus", "prometheus.yaml"))[0]
		found := false
		for _, j := range dig(prom, "scrape_configs").([]any) {
			if str(dig(j, "job_name")) == "mandate-gateway" {
				found = true
				require.Contains(t, toStrings(dig(j, "static_configs", 0, "targets")), fmt.Sprintf("gateway:%d", gport))
			}
		}
		require.True(t, found, "the alerts select job=\"mandate-gateway\"")
	})
}

func flagEnvNames(flags map[string]daemonFlag) []string {
	var out []string
	for name := range flags {
		out = append(out, envName(name))
	}
	return out
}

// TestTheGatewayRuns runs mandate-gateway configured by its Kubernetes
// ConfigMap and Secret (re-pointed at the test servers), probes it as
// Kubernetes would, reads its /metrics and its OpenAPI document, and stops
// it with SIGTERM.
func TestTheGatewayRuns(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	binary(t, "mandatectl")
	env := map[string]string{}
	for _, f := range []string{"configmap.yaml", "secret.yaml"} {
		doc := yamlDocs(t, deployPath(t, "kubernetes", "gateway", f))[0]
		data := doc["data"]
		if data == nil {
			data = doc["stringData"]
		}
		for k, v := range stringMap(t, data, f) {
			env[k] = v
		}
	}
	for k, v := range s.connection() {
		env[k] = v
	}
	// The schema and the topics, as the migration job makes them.
	initJob := exec.Command("sh", "-c", "mandatectl migrate && mandatectl topics create --partitions 2 --replication-factor 1 --kafka-tls=false --kafka-sasl-mechanism=")
	initJob.Env = baseEnv(env)
	out, err := initJob.CombinedOutput()
	require.NoError(t, err, "%s", out)

	gw := startProcess(t, "mandate-gateway", "mandate-gateway running", "gateway pod", env, append([]string{"--ops-addr", "127.0.0.1:0"}, daemonArgs...)...)
	base, ops := "http://"+gw.addr, "http://"+gw.ops
	testenv.WaitFor(t, 60*time.Second, func() bool {
		code, _ := get(t, ops+"/readyz")
		return code == http.StatusOK
	}, "the gateway is ready")
	code, _ := get(t, ops+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, base+"/v1/openapi.yaml")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "openapi: 3.1.0")
	code, body = get(t, base+"/v1/orgs/acme/mandates/m/authorizations/au_x")
	require.Equal(t, http.StatusUnauthorized, code, body)
	code, _ = get(t, base+"/metrics")
	require.Equal(t, http.StatusNotFound, code, "the API does not serve the operations endpoints")
	code, body = get(t, ops+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `mandated_gateway_requests_total{code="401",route="authorization_status"} 1`)
	require.Contains(t, body, "mandated_gateway_auth_failures_total")
	live := scrapedMetrics(t, strings.NewReader(body))
	for name, f := range declaredMetrics(t) {
		if strings.HasPrefix(name, "mandated_gateway_") && !f.vector {
			require.Contains(t, live, name, "%s is declared but the gateway does not export it", name)
		}
	}

	shutdown := parseDuration(t, env["MANDATED_SHUTDOWN_TIMEOUT"])
	stopDaemon(t, gw, shutdown+10*time.Second)
}
