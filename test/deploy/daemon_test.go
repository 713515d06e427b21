package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/testenv"
)

// stack is what the deployment would run against: a database and topics of
// the test servers, named uniquely, and the group and transactional ids.
type stack struct {
	brokers     string
	databaseURL string
	topics      map[string]string // MANDATED_*_TOPIC -> name
	group       string
	txnPrefix   string
}

// connection returns the variables that point mandated and mandatectl at
// the stack instead of the hosts the manifests name.
func (s stack) connection() map[string]string {
	env := map[string]string{"MANDATED_BROKERS": s.brokers, "MANDATED_DATABASE_URL": s.databaseURL,
		"MANDATED_GROUP": s.group, "MANDATED_RELAY_TRANSACTIONAL_ID_PREFIX": s.txnPrefix}
	for k, v := range s.topics {
		env[k] = v
	}
	return env
}

func newStack(t *testing.T) stack {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	s := stack{brokers: strings.Join(brokers, ","), databaseURL: testenv.Database(t),
		group: testenv.Name(t, "group"), txnPrefix: testenv.Name(t, "relay"),
		topics: map[string]string{
			"MANDATED_PROPOSALS_TOPIC": testenv.Name(t, "proposals"), "MANDATED_GRANTS_TOPIC": testenv.Name(t, "grants"),
			"MANDATED_DECISIONS_TOPIC": testenv.Name(t, "decisions"), "MANDATED_DEAD_LETTER_TOPIC": testenv.Name(t, "deadletter"),
		}}
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var names []string
		for _, n := range s.topics {
			names = append(names, n)
		}
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, names...)
	})
	return s
}

// baseEnv is the environment of a process started by the test: no
// variable of the test process leaks into it, except what running needs.
func baseEnv(vars ...map[string]string) []string {
	env := []string{"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + os.TempDir()}
	for _, m := range vars {
		for k, v := range m {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// daemon is one running mandated process.
type daemon struct {
	name string
	cmd  *exec.Cmd
	addr string // its HTTP server, from its "mandated running" log line
	ops  string // the gateway's operations listener, from the same line

	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
	err  error
}

func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// startDaemon runs the mandated binary with env (the manifest's variables
// and the stack's connection) and args, and waits for its HTTP server.
func startDaemon(t *testing.T, name string, env map[string]string, args ...string) *daemon {
	t.Helper()
	return startProcess(t, "mandated", "mandated running", name, env, args...)
}

// startProcess runs ./cmd/<bin> and waits for its log line running, which
// names its HTTP address.
func startProcess(t *testing.T, bin, running, name string, env map[string]string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(binary(t, bin), args...)
	cmd.Env = baseEnv(env)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	addr := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.logs.WriteString(line + "\n")
			d.mu.Unlock()
			var ev struct {
				Message string `json:"message"`
				HTTP    string `json:"http"`
				Ops     string `json:"ops"`
			}
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Message == running {
				addr <- [2]string{ev.HTTP, ev.Ops}
			}
		}
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, d.log())
		}
	})
	select {
	case a := <-addr:
		d.addr, d.ops = a[0], a[1]
	case <-d.done:
		t.Fatalf("%s exited before serving HTTP: %v\n%s", name, d.err, d.log())
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not start within 2 minutes:\n%s", name, d.log())
	}
	return d
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stopDaemon sends SIGTERM and waits at most grace for a clean exit.
func stopDaemon(t *testing.T, d *daemon, grace time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-d.done:
	case <-time.After(grace):
		t.Fatalf("%s did not exit within %s of SIGTERM:\n%s", d.name, grace, d.log())
	}
	require.NoError(t, d.err, "%s exits 0 after SIGTERM:\n%s", d.name, d.log())
	return time.Since(start)
}

// daemonArgs are the only flags the test adds to a manifest's variables:
// the HTTP server on a free loopback port (the port the manifests name is
// checked statically), JSON logs to find it, and no Kafka TLS or SASL,
// which the test broker does not speak.
var daemonArgs = []string{"--http-addr", "127.0.0.1:0", "--log-format", "json", "--kafka-tls=false", "--kafka-sasl-mechanism="}

// TestTheDeploymentRuns plays the deployment against the test servers: the
// compose init job's script, then one daemon configured by the Kubernetes
// ConfigMap and Secret and one by a compose replica's environment, sharing
// the partitions; it probes them as Kubernetes and compose would, reads
// their /metrics, and stops them as the orchestrators do.
func TestTheDeploymentRuns(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	objs := k8sObjects(t)
	compose := composeFile(t)
	services := compose["services"].(map[string]any)
	binary(t, "mandatectl")

	// 1. The init job, as compose runs it (sh -c in the image, whose PATH
	// has both binaries), with the compose environment re-pointed at the
	// stack.
	composeEnv := stringMap(t, dig(services, "mandated-init", "environment"), "mandated-init environment")
	for k, v := range s.connection() {
		composeEnv[k] = v
	}
	entry := toStrings(dig(services, "mandated-init", "entrypoint"))
	command := toStrings(dig(services, "mandated-init", "command"))
	require.Equal(t, []string{"/bin/sh", "-c"}, entry)
	initJob := exec.Command("sh", append([]string{"-c"}, command...)...)
	initJob.Env = baseEnv(composeEnv)
	out, err := initJob.CombinedOutput()
	require.NoError(t, err, "the init job fails:\n%s", out)
	require.Contains(t, string(out), "applied 0001_init.sql")
	require.Contains(t, string(out), "created "+s.topics["MANDATED_DECISIONS_TOPIC"])

	// 2. The daemons.
	k8sEnv := stringMap(t, one(t, objs, "ConfigMap")["data"], "ConfigMap")
	for k, v := range stringMap(t, one(t, objs, "Secret")["stringData"], "Secret") {
		k8sEnv[k] = v
	}
	for k, v := range s.connection() {
		k8sEnv[k] = v
	}
	k8sEnv["MANDATED_OWNER"] = "mandated-0" // the Downward API's pod name
	k8sEnv["MANDATED_INSTANCE_ID"] = "mandated-0"
	var replica string
	for name := range mandatedServices(t, compose) {
		if replica == "" || name < replica {
			replica = name
		}
	}
	replicaEnv := stringMap(t, dig(services, replica, "environment"), replica+" environment")
	for k, v := range s.connection() {
		replicaEnv[k] = v
	}
	k8s := startDaemon(t, "kubernetes pod", k8sEnv, daemonArgs...)
	rep := startDaemon(t, "compose "+replica, replicaEnv, daemonArgs...)

	for _, d := range []*daemon{k8s, rep} {
		testenv.WaitFor(t, 90*time.Second, func() bool {
			code, _ := get(t, "http://"+d.addr+"/readyz")
			return code == http.StatusOK
		}, d.name+" is ready")
	}

	// 3. A grant through mandatectl, configured by the same environment,
	// proves the pair decides and publishes.
	ctl := exec.Command(binary(t, "mandatectl"), "grant", "--mandate", "acme/deploy-check", "--operation", "refund",
		"--max-amount", "100", "--currency", "EUR", "--json", "--timeout", "90s", "--kafka-tls=false", "--kafka-sasl-mechanism=")
	ctl.Env = baseEnv(k8sEnv)
	out, err = ctl.CombinedOutput()
	require.NoError(t, err, "mandatectl grant:\n%s", out)
	require.Contains(t, string(out), `"outcome":"granted"`)

	t.Run("the StatefulSet's probes answer on the daemon's routes", func(t *testing.T) {
		c := dig(one(t, objs, "StatefulSet"), "spec", "template", "spec", "containers", 0)
		for _, probe := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
			path := str(dig(c, probe, "httpGet", "path"))
			require.NotEmpty(t, path, probe)
			code, body := get(t, "http://"+k8s.addr+path)
			require.Equal(t, http.StatusOK, code, "%s %s: %s", probe, path, body)
		}
		code, body := get(t, "http://"+k8s.addr+"/readyz")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, body, "partitions owned")
		// A path the daemon does not serve is a 404: the probes' 200s mean
		// their paths are real routes.
		code, _ = get(t, "http://"+k8s.addr+"/ready")
		require.Equal(t, http.StatusNotFound, code)
	})

	t.Run("the compose health check answers on the replica", func(t *testing.T) {
		test := toStrings(dig(services, replica, "healthcheck", "test"))
		url := test[len(test)-1]
		require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), url)
		path := "/" + strings.SplitN(strings.TrimPrefix(url, "http://"), "/", 2)[1]
		code, body := get(t, "http://"+rep.addr+path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	})

	t.Run("every metric the alerts and the dashboard use is exported by the running daemon", func(t *testing.T) {
		live := catalogue{}
		for _, d := range []*daemon{k8s, rep} {
			code, body := get(t, "http://"+d.addr+"/metrics")
			require.Equal(t, http.StatusOK, code)
			for name, f := range scrapedMetrics(t, strings.NewReader(body)) {
				live.add(name, f.typ, sortedKeys(f.labels), false)
			}
		}
		declared := declaredMetrics(t)
		// Everything the code declares that is not a vector is on /metrics
		// from the start: the daemon registers every collector.
		for name, f := range declared {
			if !f.vector && !strings.HasPrefix(name, "mandated_verify_") && !strings.HasPrefix(name, "mandated_gateway_") { // mandatectl verify's; the gateway's: TestTheGatewayRuns
				_, ok := live[name]
				require.True(t, ok, "%s is declared but the daemon does not export it", name)
			}
		}
		all := catalogue{}
		for _, c := range []catalogue{declared, live} {
			for name, f := range c {
				all.add(name, f.typ, sortedKeys(f.labels), f.vector)
			}
		}
		usages := append(alertExpressions(t), dashboardExpressions(t)...)
		problems, used := usageProblems(all, usages)
		require.Empty(t, problems)
		// Vectors appear once observed: after a grant, the decisions are.
		require.Contains(t, live, "mandated_decisions_total")
		require.Contains(t, used, "mandated_decisions_total")
	})

	t.Run("SIGTERM stops each within its grace period, exiting 0", func(t *testing.T) {
		pod := dig(one(t, objs, "StatefulSet"), "spec", "template", "spec")
		grace := time.Duration(dig(pod, "terminationGracePeriodSeconds").(int)) * time.Second
		took := stopDaemon(t, k8s, grace)
		t.Logf("the Kubernetes-configured daemon stopped in %s (grace %s)", took, grace)
		require.Contains(t, k8s.log(), `"message":"stopped"`)

		composeGrace := parseDuration(t, str(dig(services, replica, "stop_grace_period")))
		took = stopDaemon(t, rep, composeGrace)
		t.Logf("the compose-configured daemon stopped in %s (grace %s)", took, composeGrace)
	})
}

// TestTheKubernetesJobScriptRuns runs the migration Job's script with the
// ConfigMap's environment (re-pointed at the test servers) up to what a
// one-broker test server can do: the replication factor is lowered to 1.
func TestTheKubernetesJobScriptRuns(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	objs := k8sObjects(t)
	env := stringMap(t, one(t, objs, "ConfigMap")["data"], "ConfigMap")
	for k, v := range s.connection() {
		env[k] = v
	}
	// The test broker speaks neither TLS nor SASL.
	delete(env, "MANDATED_KAFKA_TLS")
	delete(env, "MANDATED_KAFKA_SASL_MECHANISM")
	c := dig(one(t, objs, "Job"), "spec", "template", "spec", "containers", 0)
	script := strings.Join(toStrings(dig(c, "args")), " ")
	script = strings.NewReplacer("--replication-factor 3", "--replication-factor 1", "--min-insync-replicas 2", "--min-insync-replicas 1").Replace(script)
	require.Equal(t, []string{"/bin/sh", "-c"}, toStrings(dig(c, "command")))
	job := exec.Command("sh", "-c", script)
	job.Env = baseEnv(env)
	binary(t, "mandatectl")
	out, err := job.CombinedOutput()
	require.NoError(t, err, "%s\n%s", script, out)
	require.Contains(t, string(out), "applied 0001_init.sql")
	require.Regexp(t, fmt.Sprintf(`%s\s+12\s+1\s+1\s`, s.topics["MANDATED_PROPOSALS_TOPIC"]), string(out))

	// Run again, as a re-applied Job would: nothing to do, still exit 0.
	job = exec.Command("sh", "-c", script)
	job.Env = baseEnv(env)
	out, err = job.CombinedOutput()
	require.NoError(t, err, "%s\n%s", script, out)
	require.Contains(t, string(out), "schema is up to date")
	require.NotContains(t, string(out), "created ")
}
