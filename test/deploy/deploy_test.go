// Package deploy checks deploy/ against the code it deploys: every manifest
// parses; the alert rules pass promtool (and their unit tests); every metric
// and label the alerts and the dashboard use is one mandated exports; every
// MANDATED_* variable is a flag of the daemon; the probes, ports and grace
// periods match the daemon's routes, --http-addr and --shutdown-timeout; and
// the daemon, configured exactly as the Kubernetes ConfigMap and the compose
// file configure it, becomes ready, answers its probes and stops in time.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/mandated/mandated/test/testenv"
)

var binDir string

func TestMain(m *testing.M) {
	testenv.SkipPackageInShortTier("the deployment's binaries, images and manifests, built and run")
	dir, err := os.MkdirTemp("", "mandated-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// root is the repository root.
func root(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func deployPath(t testing.TB, parts ...string) string {
	return filepath.Join(append([]string{root(t), "deploy"}, parts...)...)
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// binary builds ./cmd/<name> once per test process.
func binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	p := filepath.Join(binDir, name)
	cmd := exec.Command("go", "build", "-o", p, "./cmd/"+name)
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/%s:\n%s", name, out)
	built[name] = p
	return p
}

// daemonFlag is one flag of `mandated --help`.
type daemonFlag struct {
	Name, Default string
}

var (
	flagsOnce   sync.Once
	daemonFlags map[string]daemonFlag
	flagsErr    error
)

var (
	helpFlagLine = regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)(?: (\S+))?$`)
	helpDefault  = regexp.MustCompile(`\(default "?([^")]*)"?\)$`)
)

// mandatedFlags parses the flags out of the built daemon's --help.
func mandatedFlags(t testing.TB) map[string]daemonFlag {
	t.Helper()
	bin := binary(t, "mandated")
	flagsOnce.Do(func() { daemonFlags, flagsErr = helpFlags(bin) })
	require.NoError(t, flagsErr)
	require.Greater(t, len(daemonFlags), 20, "mandated --help lists its flags")
	return daemonFlags
}

var (
	gatewayFlagsOnce sync.Once
	gatewayFlagSet   map[string]daemonFlag
	gatewayFlagsErr  error
)

// gatewayFlags parses the flags out of the built gateway's --help.
func gatewayFlags(t testing.TB) map[string]daemonFlag {
	t.Helper()
	bin := binary(t, "mandate-gateway")
	gatewayFlagsOnce.Do(func() { gatewayFlagSet, gatewayFlagsErr = helpFlags(bin) })
	require.NoError(t, gatewayFlagsErr)
	require.Greater(t, len(gatewayFlagSet), 10, "mandate-gateway --help lists its flags")
	return gatewayFlagSet
}

// helpFlags runs bin --help and reads its flags and their defaults.
func helpFlags(bin string) (map[string]daemonFlag, error) {
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --help: %w\n%s", bin, err, out)
	}
	flags := map[string]daemonFlag{}
	var cur string
	for _, line := range strings.Split(string(out), "\n") {
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			flags[cur] = daemonFlag{Name: cur}
			continue
		}
		if cur != "" && strings.HasPrefix(line, "    \t") {
			if m := helpDefault.FindStringSubmatch(line); m != nil {
				f := flags[cur]
				f.Default = m[1]
				flags[cur] = f
			}
		}
	}
	return flags, nil
}

// envName is cli.EnvName (internal to cmd/): --kafka-sasl-user is
// MANDATED_KAFKA_SASL_USER.
func envName(flag string) string {
	return "MANDATED_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envToFlag maps every MANDATED_* variable the daemon reads to its flag.
func envToFlag(t testing.TB) map[string]string {
	out := map[string]string{}
	for name := range mandatedFlags(t) {
		out[envName(name)] = name
	}
	return out
}

// yamlDocs decodes every document of a YAML file.
func yamlDocs(t testing.TB, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "%s", path)
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	require.NotEmpty(t, docs, "%s has no YAML document", path)
	return docs
}

// dig walks nested maps and lists: dig(doc, "spec", "template", "spec").
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}

// k8sObjects returns every Kubernetes object in deploy/kubernetes by kind.
func k8sObjects(t testing.TB) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	files, err := filepath.Glob(deployPath(t, "kubernetes", "*.yaml"))
	require.NoError(t, err)
	for _, f := range files {
		for _, d := range yamlDocs(t, f) {
			out[str(d["kind"])] = append(out[str(d["kind"])], d)
		}
	}
	return out
}

func one(t testing.TB, objs map[string][]map[string]any, kind string) map[string]any {
	t.Helper()
	require.Len(t, objs[kind], 1, "deploy/kubernetes has one %s", kind)
	return objs[kind][0]
}

// stringMap turns a YAML map into map[string]string.
func stringMap(t testing.TB, v any, what string) map[string]string {
	t.Helper()
	m, ok := v.(map[string]any)
	require.True(t, ok, "%s is a map", what)
	out := map[string]string{}
	for k, x := range m {
		out[k] = str(x)
	}
	return out
}

// composeFile returns deploy/compose/docker-compose.yaml, merge keys resolved.
func composeFile(t testing.TB) map[string]any {
	docs := yamlDocs(t, deployPath(t, "compose", "docker-compose.yaml"))
	require.Len(t, docs, 1)
	return docs[0]
}

// mandatedServices returns the compose services that run the daemon.
func mandatedServices(t testing.TB, compose map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	services, ok := compose["services"].(map[string]any)
	require.True(t, ok)
	for name, s := range services {
		svc := s.(map[string]any)
		if str(svc["image"]) == "mandated:dev" && svc["entrypoint"] == nil {
			out[name] = svc
		}
	}
	return out
}

// portOf returns the port of a listen address such as ":8080".
func portOf(t testing.TB, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err, "address %q", addr)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

func parseDuration(t testing.TB, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	require.NoError(t, err, "duration %q", s)
	return d
}

func TestEveryManifestParses(t *testing.T) {
	t.Parallel()
	var seen []string
	err := filepath.WalkDir(deployPath(t), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root(t), path)
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			yamlDocs(t, path)
			seen = append(seen, rel)
		case ".json":
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			var v any
			require.NoError(t, json.Unmarshal(b, &v), "%s", rel)
			seen = append(seen, rel)
		}
		return nil
	})
	require.NoError(t, err)
	sort.Strings(seen)
	for _, want := range []string{
		"deploy/compose/docker-compose.yaml", "deploy/grafana/mandated.json",
		"deploy/kubernetes/statefulset.yaml", "deploy/kubernetes/configmap.yaml", "deploy/kubernetes/secret.yaml",
		"deploy/kubernetes/pdb.yaml", "deploy/kubernetes/service.yaml", "deploy/kubernetes/migrate-job.yaml",
		"deploy/kubernetes/verify-cronjob.yaml", "deploy/prometheus/alerts.yaml", "deploy/prometheus/prometheus.yaml",
	} {
		require.Contains(t, seen, want)
	}
}

func TestEveryEnvironmentVariableIsADaemonFlag(t *testing.T) {
	t.Parallel()
	flags := envToFlag(t)
	mention := regexp.MustCompile(`MANDATED_[A-Z0-9_]*[A-Z0-9]`)

	gwFlags := map[string]bool{}
	for name := range gatewayFlags(t) {
		gwFlags[envName(name)] = true
	}
	for name := range mcpFlags(t) { // mandate-mcp's (mcp_test.go)
		gwFlags[envName(name)] = true
	}
	t.Run("every MANDATED_ name anywhere in deploy/ is a flag of mandated or of the gateway", func(t *testing.T) {
		err := filepath.WalkDir(deployPath(t), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			for _, name := range mention.FindAllString(string(b), -1) {
				_, ok := flags[name]
				require.True(t, ok || gwFlags[name], "%s names %s, which is not a flag of mandated (`mandated --help`) nor of mandate-gateway nor of mandate-mcp", path, name)
			}
			return nil
		})
		require.NoError(t, err)
	})

	objs := k8sObjects(t)
	cm := stringMap(t, one(t, objs, "ConfigMap")["data"], "ConfigMap data")
	secret := stringMap(t, one(t, objs, "Secret")["stringData"], "Secret stringData")

	t.Run("the ConfigMap holds only flags and no secrets", func(t *testing.T) {
		require.NotEmpty(t, cm)
		for k := range cm {
			require.Contains(t, flags, k, "ConfigMap key %s is not a flag of mandated", k)
			require.NotRegexp(t, `PASSWORD|DATABASE_URL$`, k, "%s is a secret: it belongs in the Secret", k)
		}
	})

	t.Run("the Secret holds the database URL and the SASL password, as placeholders", func(t *testing.T) {
		require.Equal(t, []string{"MANDATED_DATABASE_URL", "MANDATED_KAFKA_SASL_PASSWORD"}, sortedKeys(secret))
		for k, v := range secret {
			require.Contains(t, flags, k)
			require.Contains(t, v, "REPLACE_ME", "%s must be a placeholder, never a real secret", k)
		}
	})

	t.Run("the StatefulSet and the Job read the ConfigMap and the Secret, and set only flags", func(t *testing.T) {
		cmName := str(dig(one(t, objs, "ConfigMap"), "metadata", "name"))
		secretName := str(dig(one(t, objs, "Secret"), "metadata", "name"))
		for _, kind := range []string{"StatefulSet", "Job"} {
			c := dig(one(t, objs, kind), "spec", "template", "spec", "containers", 0)
			require.NotNil(t, c, kind)
			require.Equal(t, cmName, str(dig(c, "envFrom", 0, "configMapRef", "name")), kind)
			require.Equal(t, secretName, str(dig(c, "envFrom", 1, "secretRef", "name")), kind)
			env, _ := dig(c, "env").([]any)
			for _, e := range env {
				name := str(dig(e, "name"))
				require.Contains(t, flags, name, "%s sets %s, which is not a flag of mandated", kind, name)
			}
		}
	})

	t.Run("the compose replicas and the init job set only flags", func(t *testing.T) {
		compose := composeFile(t)
		services := compose["services"].(map[string]any)
		require.NotNil(t, services["mandated-init"])
		for name, s := range services {
			env, ok := dig(s, "environment").(map[string]any)
			if !ok || !strings.HasPrefix(name, "mandated") {
				continue
			}
			for k := range env {
				require.Contains(t, flags, k, "compose service %s sets %s, which is not a flag of mandated", name, k)
			}
		}
		replicas := mandatedServices(t, compose)
		require.Len(t, replicas, 3, "three mandated replicas")
		owners := map[string]bool{}
		for name, svc := range replicas {
			env := stringMap(t, svc["environment"], name+" environment")
			require.NotEmpty(t, env["MANDATED_BROKERS"], name)
			require.NotEmpty(t, env["MANDATED_DATABASE_URL"], name)
			owners[env["MANDATED_OWNER"]] = true
		}
		require.Len(t, owners, 3, "each replica names itself in the partitions table")
	})
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	flags := mandatedFlags(t)
	objs := k8sObjects(t)
	cm := stringMap(t, one(t, objs, "ConfigMap")["data"], "ConfigMap data")
	dep := one(t, objs, "StatefulSet")
	pod := dig(dep, "spec", "template", "spec")
	c := dig(pod, "containers", 0)

	httpAddr := cmp(cm["MANDATED_HTTP_ADDR"], flags["http-addr"].Default)
	port := portOf(t, httpAddr)
	shutdown := parseDuration(t, cmp(cm["MANDATED_SHUTDOWN_TIMEOUT"], flags["shutdown-timeout"].Default))

	t.Run("the StatefulSet runs three replicas, none of them namespaced", func(t *testing.T) {
		require.Equal(t, 3, dig(dep, "spec", "replicas"))
		for kind, list := range objs {
			for _, o := range list {
				require.Nil(t, dig(o, "metadata", "namespace"), "%s must not name a namespace", kind)
			}
		}
	})

	t.Run("the container port is the port of --http-addr", func(t *testing.T) {
		ports, _ := dig(c, "ports").([]any)
		require.Len(t, ports, 1)
		require.Equal(t, port, dig(ports[0], "containerPort"))
	})

	resolve := func(p any) int {
		if n, ok := p.(int); ok {
			return n
		}
		for _, cp := range dig(c, "ports").([]any) {
			if str(dig(cp, "name")) == str(p) {
				return dig(cp, "containerPort").(int)
			}
		}
		t.Fatalf("port %v is not a container port", p)
		return 0
	}

	t.Run("readiness probes /readyz and liveness /healthz on the metrics port", func(t *testing.T) {
		require.Equal(t, "/readyz", str(dig(c, "readinessProbe", "httpGet", "path")))
		require.Equal(t, port, resolve(dig(c, "readinessProbe", "httpGet", "port")))
		require.Equal(t, "/healthz", str(dig(c, "livenessProbe", "httpGet", "path")))
		require.Equal(t, port, resolve(dig(c, "livenessProbe", "httpGet", "port")))
		if sp := dig(c, "startupProbe"); sp != nil {
			require.Equal(t, "/healthz", str(dig(sp, "httpGet", "path")))
			require.Equal(t, port, resolve(dig(sp, "httpGet", "port")))
		}
		require.Equal(t, strconv.Itoa(port), str(dig(dep, "spec", "template", "metadata", "annotations", "prometheus.io/port")))
		require.Equal(t, "/metrics", str(dig(dep, "spec", "template", "metadata", "annotations", "prometheus.io/path")))
	})

	t.Run("the grace period is longer than --shutdown-timeout", func(t *testing.T) {
		grace := time.Duration(dig(pod, "terminationGracePeriodSeconds").(int)) * time.Second
		require.Greater(t, grace, shutdown, "terminationGracePeriodSeconds must exceed MANDATED_SHUTDOWN_TIMEOUT")
	})

	t.Run("the owner and the static membership instance id are the pod's name", func(t *testing.T) {
		env, _ := dig(c, "env").([]any)
		found := map[string]bool{}
		for _, e := range env {
			found[str(dig(e, "name"))] = str(dig(e, "valueFrom", "fieldRef", "fieldPath")) == "metadata.name"
		}
		require.True(t, found["MANDATED_OWNER"])
		require.True(t, found["MANDATED_INSTANCE_ID"], "a restarted pod rejoins as the same static member and moves nothing")
		require.Equal(t, "consumer", cm["MANDATED_GROUP_PROTOCOL"], "the incremental KIP-848 protocol")
		require.Equal(t, str(dig(one(t, objs, "Service"), "metadata", "name")), str(dig(dep, "spec", "serviceName")))
	})

	t.Run("the PodDisruptionBudget keeps two of the StatefulSet's pods", func(t *testing.T) {
		pdb := one(t, objs, "PodDisruptionBudget")
		require.Equal(t, 2, dig(pdb, "spec", "minAvailable"))
		require.Equal(t, dig(dep, "spec", "selector", "matchLabels"), dig(pdb, "spec", "selector", "matchLabels"))
	})

	t.Run("the metrics Service selects the pods on the metrics port", func(t *testing.T) {
		svc := one(t, objs, "Service")
		require.Equal(t, dig(dep, "spec", "selector", "matchLabels"), dig(svc, "spec", "selector"))
		require.Equal(t, port, resolve(dig(svc, "spec", "ports", 0, "targetPort")))
		labels := dig(dep, "spec", "template", "metadata", "labels").(map[string]any)
		for k, v := range dig(dep, "spec", "selector", "matchLabels").(map[string]any) {
			require.Equal(t, v, labels[k])
		}
	})

	t.Run("the migration Job runs mandatectl migrate, then topics create", func(t *testing.T) {
		job := one(t, objs, "Job")
		jc := dig(job, "spec", "template", "spec", "containers", 0)
		script := strings.Join(append(toStrings(dig(jc, "command")), toStrings(dig(jc, "args"))...), " ")
		require.Contains(t, script, "mandatectl migrate && mandatectl topics create")
		checkMandatectlScript(t, script)
	})

	t.Run("the verify CronJob runs mandatectl verify with flags it has, hourly, never two at once", func(t *testing.T) {
		cj := one(t, objs, "CronJob")
		require.Equal(t, "Forbid", str(dig(cj, "spec", "concurrencyPolicy")))
		require.Len(t, strings.Fields(str(dig(cj, "spec", "schedule"))), 5)
		pod := dig(cj, "spec", "jobTemplate", "spec", "template", "spec")
		jc := dig(pod, "containers", 0)
		script := strings.Join(append(toStrings(dig(jc, "command")), toStrings(dig(jc, "args"))...), " ")
		require.Contains(t, script, "mandatectl verify")
		require.Contains(t, script, "--pushgateway")
		checkMandatectlScript(t, script)
		require.Equal(t, dig(one(t, objs, "Job"), "spec", "template", "spec", "containers", 0, "envFrom"), dig(jc, "envFrom"),
			"verify connects as the migration Job does")
	})

	t.Run("kubectl kustomize builds the directory", func(t *testing.T) {
		kubectl, err := exec.LookPath("kubectl")
		if err != nil {
			t.Skip("kubectl is not installed; the YAML checks above still ran")
		}
		out, err := exec.Command(kubectl, "kustomize", deployPath(t, "kubernetes")).CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, kind := range []string{"ConfigMap", "Secret", "StatefulSet", "PodDisruptionBudget", "Service", "Job", "CronJob"} {
			require.Contains(t, string(out), "kind: "+kind)
		}
		require.Contains(t, string(out), "image: registry.example.com/mandated:0.1.0")
	})
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func toStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		out = append(out, str(x))
	}
	return out
}

// checkMandatectlScript checks that every mandatectl invocation of a
// `sh -c` script uses only flags mandatectl has: with --help appended, an
// unknown flag fails the parse before --help is reached.
func checkMandatectlScript(t *testing.T, script string) {
	t.Helper()
	bin := binary(t, "mandatectl")
	_, body, ok := strings.Cut(script, "-c ")
	require.True(t, ok, "the script runs through sh -c: %q", script)
	for _, part := range strings.Split(body, "&&") {
		fields := strings.Fields(part)
		require.NotEmpty(t, fields)
		require.Equal(t, "mandatectl", fields[0], "%q", part)
		out, err := exec.Command(bin, append(fields[1:], "--help")...).CombinedOutput()
		require.NoError(t, err, "mandatectl %s:\n%s", strings.Join(fields[1:], " "), out)
	}
}

func TestComposeFile(t *testing.T) {
	t.Parallel()
	flags := mandatedFlags(t)
	compose := composeFile(t)
	services := compose["services"].(map[string]any)
	replicas := mandatedServices(t, compose)

	for _, name := range []string{"kafka", "postgres", "mandated-init", "prometheus"} {
		require.Contains(t, services, name)
	}
	require.True(t, strings.HasPrefix(str(dig(services, "kafka", "image")), "apache/kafka:"), "the KRaft image")
	require.Equal(t, "broker,controller", str(dig(services, "kafka", "environment", "KAFKA_PROCESS_ROLES")))

	t.Run("the replicas start after the init job and are probed on --http-addr's port", func(t *testing.T) {
		for name, svc := range replicas {
			env := stringMap(t, svc["environment"], name)
			port := portOf(t, cmp(env["MANDATED_HTTP_ADDR"], flags["http-addr"].Default))
			require.Equal(t, "service_completed_successfully", str(dig(svc, "depends_on", "mandated-init", "condition")), name)
			test := strings.Join(toStrings(dig(svc, "healthcheck", "test")), " ")
			require.Contains(t, test, fmt.Sprintf("http://127.0.0.1:%d/readyz", port), name)
			grace := parseDuration(t, str(svc["stop_grace_period"]))
			shutdown := parseDuration(t, cmp(env["MANDATED_SHUTDOWN_TIMEOUT"], flags["shutdown-timeout"].Default))
			require.Greater(t, grace, shutdown, "%s: stop_grace_period must exceed MANDATED_SHUTDOWN_TIMEOUT", name)
		}
	})

	t.Run("Prometheus scrapes every replica's /metrics and probes its /readyz", func(t *testing.T) {
		prom := yamlDocs(t, deployPath(t, "prometheus", "prometheus.yaml"))[0]
		jobs := map[string]any{}
		for _, j := range dig(prom, "scrape_configs").([]any) {
			jobs[str(dig(j, "job_name"))] = j
		}
		require.Contains(t, jobs, "mandated", "the alerts select job=\"mandated\"")
		require.Equal(t, "/metrics", str(dig(jobs["mandated"], "metrics_path")))
		targets := toStrings(dig(jobs["mandated"], "static_configs", 0, "targets"))
		probes := toStrings(dig(jobs["mandated-readyz"], "static_configs", 0, "targets"))
		require.Len(t, targets, len(replicas))
		for name, svc := range replicas {
			env := stringMap(t, svc["environment"], name)
			addr := fmt.Sprintf("%s:%d", name, portOf(t, cmp(env["MANDATED_HTTP_ADDR"], flags["http-addr"].Default)))
			require.Contains(t, targets, addr)
			require.Contains(t, probes, "http://"+addr+"/readyz")
		}
		require.Equal(t, []string{"alerts.yaml"}, toStrings(prom["rule_files"]))
		mounts := strings.Join(toStrings(dig(services, "prometheus", "volumes")), "\n")
		require.Contains(t, mounts, "../prometheus/alerts.yaml:/etc/prometheus/alerts.yaml")
		require.Contains(t, mounts, "../prometheus/prometheus.yaml:/etc/prometheus/prometheus.yaml")
	})

	t.Run("every file the stack mounts exists", func(t *testing.T) {
		for name, s := range services {
			for _, v := range toStrings(dig(s, "volumes")) {
				src, _, _ := strings.Cut(v, ":")
				if !strings.HasPrefix(src, ".") {
					continue // a named volume
				}
				_, err := os.Stat(filepath.Join(deployPath(t, "compose"), src))
				require.NoError(t, err, "service %s mounts %s", name, src)
			}
		}
		ctxDir := filepath.Join(deployPath(t, "compose"), str(dig(services, "mandated-init", "build", "context")))
		_, err := os.Stat(filepath.Join(ctxDir, str(dig(services, "mandated-init", "build", "dockerfile"))))
		require.NoError(t, err, "the build context and Dockerfile exist")
	})

	t.Run("the init job's script is valid mandatectl", func(t *testing.T) {
		init := services["mandated-init"]
		script := strings.Join(append(toStrings(dig(init, "entrypoint")), toStrings(dig(init, "command"))...), " ")
		require.Contains(t, script, "mandatectl migrate && mandatectl topics create")
		checkMandatectlScript(t, script)
	})
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(deployPath(t, "docker", "Dockerfile"))
	require.NoError(t, err)
	df := string(b)
	require.Contains(t, df, "./cmd/mandated ./cmd/mandatectl", "both binaries are in the image")
	require.Contains(t, df, `ENTRYPOINT ["/usr/local/bin/mandated"]`)
	port := portOf(t, mandatedFlags(t)["http-addr"].Default)
	require.Contains(t, df, fmt.Sprintf("EXPOSE %d", port))

	// The .dockerignore keeps only what the build needs: every package the
	// binaries import must be let through.
	ignore, err := os.ReadFile(deployPath(t, "docker", "Dockerfile.dockerignore"))
	require.NoError(t, err)
	var allowed []string
	for _, line := range strings.Split(string(ignore), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "!"); ok {
			allowed = append(allowed, strings.TrimSuffix(p, "/"))
		}
	}
	require.Contains(t, df, "./cmd/mandate-gateway", "the gateway is in the image")
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./cmd/mandated", "./cmd/mandatectl", "./cmd/mandate-gateway")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(pkg, "github.com/mandated/mandated/")
		if !ok {
			continue
		}
		top, _, _ := strings.Cut(rel, "/")
		require.Contains(t, allowed, top, "Dockerfile.dockerignore must let %s into the build context", rel)
	}
}
