// Package probe is the outside probe of the HTTP gateway as a load test:
// the real binaries (mandated and mandate-gateway) against real Kafka and
// PostgreSQL on loopback, driven by concurrent HTTP clients the way the
// issue-24 probe drove them (curl-style requests: propose, begin, commit).
//
// It is not part of `make test` (it runs for a fixed time and reports
// figures, it asserts little): run it with `make probe-gateway`, or
//
//	MANDATED_GATEWAY_PROBE=1 go test -count=1 -v -run TestGatewayProbe ./test/probe/
//
// MANDATED_GATEWAY_PROBE_CLIENTS (16), MANDATED_GATEWAY_PROBE_DURATION (30s)
// and MANDATED_GATEWAY_PROBE_REPORT (a file the figures are appended to)
// change it. MANDATED_GATEWAY_PROBE_TRACING=1 turns tracing on in both
// binaries (--otlp-endpoint: a collector the test serves, which accepts
// and counts every export), every request sampled: the cost of traces. Build it without -race: the figures are the binaries' own.
package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/wire"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func joinComma(s []string) string { return strings.Join(s, ",") }

// stack is one mandated process and one gateway process over a harness's
// database and topics.
type stack struct {
	h     *harness.Harness
	base  string
	token string
	gw    *procs.Process
	// exports and exportedBytes count the OTLP exports the collector took
	// (tracing on).
	exports, exportedBytes atomic.Int64
}

// startStack starts mandated and mandate-gateway over a new harness; with
// tracing, both export their spans to a collector the test serves.
func startStack(t *testing.T, partitions int32, tracing bool) *stack {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: partitions})
	s := &stack{h: h}
	var traceArgs []string
	if tracing {
		collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := io.Copy(io.Discard, r.Body)
			s.exports.Add(1)
			s.exportedBytes.Add(n)
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse: everything accepted
		}))
		t.Cleanup(collector.Close)
		traceArgs = []string{"--otlp-endpoint", collector.URL, "--trace-sample-ratio", "1"}
	}
	p := procs.StartMandated(t, "mandated", append([]string{
		"--brokers", joinComma(h.Brokers), "--database-url", h.DatabaseURL,
		"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter,
		"--group", h.Group, "--relay-transactional-id-prefix", h.TxnPrefix,
		"--log-level", "warn",
	}, traceArgs...), nil)
	p.WaitReady(2 * time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, h.DatabaseURL)
	require.NoError(t, err)
	_, token, err := gateway.CreateToken(ctx, conn, "acme", "probe")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	port, ops := procs.FreePort(t), procs.FreePort(t)
	bin := procs.Binary(t, "mandate-gateway")
	args := []string{
		"--database-url", h.DatabaseURL, "--brokers", joinComma(h.Brokers),
		"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--http-addr", fmt.Sprintf("127.0.0.1:%d", port),
		"--log-format", "json", "--log-level", "warn",
	}
	args = append(args, traceArgs...)
	readyz := port
	// /readyz is on a listener of its own where the binary has --ops-addr
	// (the probe also measures builds from before it).
	if help, _ := exec.Command(bin, "--help").CombinedOutput(); strings.Contains(string(help), "-ops-addr") {
		args = append(args, "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops))
		readyz = ops
	}
	gw := procs.Start(t, "gateway", bin, args, nil)
	gw.HTTP = fmt.Sprintf("127.0.0.1:%d", readyz)
	gw.WaitReady(time.Minute)
	s.base, s.token, s.gw = fmt.Sprintf("http://127.0.0.1:%d", port), token, gw
	return s
}

// sample is one request's route and latency.
type sample struct {
	route  string
	status int
	took   time.Duration
}

type probeClient struct {
	s       *stack
	http    *http.Client
	mandate string
	samples []sample
}

func (c *probeClient) post(ctx context.Context, route, path string, headers map[string]string, body []byte) (int, map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.s.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.s.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Prefer", "wait=10")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, nil, err
	}
	if ctx.Err() == nil {
		c.samples = append(c.samples, sample{route: route, status: resp.StatusCode, took: took})
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, nil
}

// run loops propose → begin → commit on the client's own mandate until ctx
// ends. Each step's answer is checked: a probe that measures errors is no
// probe.
func (c *probeClient) run(ctx context.Context, id int) error {
	base := "/v1/orgs/acme/mandates/" + c.mandate
	for i := 0; ctx.Err() == nil; i++ {
		key := fmt.Sprintf("probe-%d-%d", id, i)
		code, d, err := c.post(ctx, "propose", base+"/proposals", map[string]string{"Idempotency-Key": key},
			[]byte(`{"operation":"payment.refund","amount":{"minor_units":100,"currency":"EUR"},"target":"customer-1"}`))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil || code != http.StatusOK || d["outcome"] != "reserved" {
			return fmt.Errorf("propose %s: %d %v %v", key, code, d, err)
		}
		auth := base + "/authorizations/" + d["authorization_id"].(string)
		// Both headers: the executor is this attempt (the old gateway took it
		// from Idempotency-Key on begin, the new one from Executor).
		exec := fmt.Sprintf("worker-%d-%d", id, i)
		code, d, err = c.post(ctx, "begin", auth+"/begin", map[string]string{"Idempotency-Key": exec, "Executor": exec}, []byte(`{}`))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil || code != http.StatusOK || d["outcome"] != "executing" {
			return fmt.Errorf("begin %s: %d %v %v", key, code, d, err)
		}
		tok, _ := d["execution_token"].(float64)
		code, d, err = c.post(ctx, "commit", auth+"/commit", nil,
			fmt.Appendf(nil, `{"external_ref":"re_%d_%d","execution_token":%d}`, id, i, int64(tok)))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil || code != http.StatusOK || d["outcome"] != "committed" {
			return fmt.Errorf("commit %s: %d %v %v", key, code, d, err)
		}
	}
	return nil
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }

// TestGatewayProbe drives a real gateway with concurrent clients for a
// fixed time and reports requests/s and latency percentiles.
func TestGatewayProbe(t *testing.T) {
	if os.Getenv("MANDATED_GATEWAY_PROBE") == "" {
		t.Skip("the gateway probe is a measurement: MANDATED_GATEWAY_PROBE=1 (make probe-gateway) runs it")
	}
	clients, err := strconv.Atoi(envOr("MANDATED_GATEWAY_PROBE_CLIENTS", "16"))
	require.NoError(t, err)
	duration, err := time.ParseDuration(envOr("MANDATED_GATEWAY_PROBE_DURATION", "30s"))
	require.NoError(t, err)
	warmup := min(5*time.Second, duration/5)

	tracing := os.Getenv("MANDATED_GATEWAY_PROBE_TRACING") == "1"
	s := startStack(t, 4, tracing)
	for i := range clients {
		d := s.h.SendAwait(map[string]any{"type": "grant", "org": "acme", "mandate_id": fmt.Sprintf("probe-m%d", i), "uses": 1000000,
			"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"payment.refund"}})
		require.Equal(t, wire.OutcomeGranted, d.Outcome)
	}

	// Warm up (connections, plans, caches), then measure.
	for _, phase := range []struct {
		name string
		d    time.Duration
	}{{"warmup", warmup}, {"measure", duration}} {
		ctx, cancel := context.WithTimeout(context.Background(), phase.d)
		cs := make([]*probeClient, clients)
		errs := make([]error, clients)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range cs {
			cs[i] = &probeClient{s: s, http: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 4}},
				mandate: fmt.Sprintf("probe-m%d", i)}
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = cs[i].run(ctx, i*1000000+int(start.UnixNano()%1000)) }()
		}
		wg.Wait()
		elapsed := time.Since(start)
		cancel()
		for i, err := range errs {
			require.NoError(t, err, "client %d", i)
		}
		if phase.name == "warmup" {
			continue
		}
		byRoute := map[string][]time.Duration{}
		var all []time.Duration
		for _, c := range cs {
			for _, sm := range c.samples {
				byRoute[sm.route] = append(byRoute[sm.route], sm.took)
				all = append(all, sm.took)
			}
		}
		var lines []string
		line := func(name string, ds []time.Duration) {
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			lines = append(lines, fmt.Sprintf("| %s | %d | %.0f | %s | %s | %s |", name, len(ds), float64(len(ds))/elapsed.Seconds(),
				ms(percentile(ds, 0.5)), ms(percentile(ds, 0.99)), ms(ds[len(ds)-1])))
		}
		line("all", all)
		for _, r := range []string{"propose", "begin", "commit"} {
			line(r, byRoute[r])
		}
		rev := strings.TrimSpace(envOr("MANDATED_GATEWAY_PROBE_LABEL", "this build"))
		if tracing {
			require.Positive(t, s.exports.Load(), "tracing on: the collector took no export")
			rev += fmt.Sprintf(", tracing on (%d OTLP exports, %d bytes, so far)", s.exports.Load(), s.exportedBytes.Load())
		} else {
			rev += ", tracing off"
		}
		load, _ := os.ReadFile("/proc/loadavg") // the machine may be shared
		report := fmt.Sprintf("\n### gateway probe: %s, %d clients, %s, %s, load %s\n\n| requests | count | per second | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n%s\n",
			rev, clients, duration, time.Now().UTC().Format(time.RFC3339), strings.Join(strings.Fields(string(load))[:3], " "), strings.Join(lines, "\n"))
		t.Log(report)
		if path := os.Getenv("MANDATED_GATEWAY_PROBE_REPORT"); path != "" {
			f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			require.NoError(t, err)
			_, err = f.WriteString(report)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
	}
}
