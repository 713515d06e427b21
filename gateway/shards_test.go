package gateway_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// gatewayRole creates a login role with exactly the grants of
// deploy/postgres/gateway-role.sql in every database of urls, and returns
// its name and password. The role is dropped at cleanup.
func gatewayRole(t *testing.T, urls ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	role, password := "gw_test_"+hex.EncodeToString(b), "pw-"+hex.EncodeToString(b)
	sqlFile, err := os.ReadFile(filepath.Join("..", "deploy", "postgres", "gateway-role.sql"))
	require.NoError(t, err)
	var code []string
	for _, l := range strings.Split(string(sqlFile), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			code = append(code, l)
		}
	}
	var stmts []string
	for _, s := range strings.Split(strings.Join(code, " "), ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, strings.ReplaceAll(s, "mandated_gateway", role))
		}
	}
	require.Len(t, stmts, 6, "the documented grants (the fifth: the console's history, the sixth: its sessions)")
	admin, err := pgx.Connect(ctx, urls[0])
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", role, password))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, u := range urls {
			if c, err := pgx.Connect(ctx, u); err == nil {
				_, _ = c.Exec(ctx, "DROP OWNED BY "+role)
				c.Close(ctx)
			}
		}
		if c, err := pgx.Connect(ctx, urls[0]); err == nil {
			if _, err := c.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
				t.Logf("drop role %s: %v", role, err)
			}
			c.Close(ctx)
		}
	})
	for _, u := range urls {
		c, err := pgx.Connect(ctx, u)
		require.NoError(t, err)
		for _, s := range stmts {
			_, err := c.Exec(ctx, s)
			require.NoError(t, err, "%s", s)
		}
		c.Close(ctx)
	}
	return role, password
}

// onPartition returns a mandate id of org acme whose home is partition p of n.
func onPartition(p, n int32, prefix string) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); partitioner.ForKey([]byte("acme/"+id), n) == p {
			return id
		}
	}
}

func writeMap(t *testing.T, path string, shards [][3]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("shards:\n")
	for _, s := range shards {
		fmt.Fprintf(&b, "  - name: %s\n    partitions: %q\n    url: %q\n", s[0], s[1], s[2])
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
}

// A shard map of three databases (ctl: partition 0 and the tokens, a: 1,
// b: 2-3) and a gateway connecting to each shard as the documented role
// only (deploy/postgres/gateway-role.sql, --shard-user). Each status read
// goes to its mandate's shard: with shard a cut off (a proxy that
// swallows everything) the statuses on b answer at once; and after
// partition 1 moves to b the gateway, told by a that it moved, reads the
// map again and follows it.
func TestGatewayReadsEachStatusOnItsMandatesShardAsTheDocumentedRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urls := map[string]string{"ctl": testdb.Migrated(t), "a": testdb.Migrated(t), "b": testdb.Migrated(t)}
	dir := t.TempDir()
	procMap := filepath.Join(dir, "processors.yaml")
	writeMap(t, procMap, [][3]string{{"ctl", "0", urls["ctl"]}, {"a", "1", urls["a"]}, {"b", "2-3", urls["b"]}})
	m, err := shardmap.Read(procMap)
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 4, Configure: func(c *processor.ServiceConfig) { c.Shards = m }})
	h.Start("a")
	role, password := gatewayRole(t, urls["ctl"], urls["a"], urls["b"])

	proxyA := testenv.StartProxy(t, hostOf(t, urls["a"]))
	gwMap := filepath.Join(dir, "gateway.yaml")
	writeMap(t, gwMap, [][3]string{{"ctl", "0", urls["ctl"]}, {"a", "1", proxyA.URL(urls["a"])}, {"b", "2-3", urls["b"]}})
	shards, err := gateway.OpenShards(ctx, gwMap, func(ctx context.Context, u string) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return nil, err
		}
		cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		return pgxpool.NewWithConfig(ctx, cfg)
	}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(shards.Close)

	rw, err := pgx.Connect(ctx, urls["ctl"])
	require.NoError(t, err)
	t.Cleanup(func() { rw.Close(context.Background()) })
	_, token, err := gateway.CreateToken(ctx, rw, "acme", "shards")
	require.NoError(t, err)
	cl, err := client.New(ctx, client.Config{Brokers: h.Brokers, ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants,
		DecisionsTopic: h.Spec.Decisions, FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	srv, err := gateway.New(gateway.Config{QueryTimeout: 5 * time.Second}, cl, shards.Control(), prometheus.NewRegistry())
	require.NoError(t, err)
	srv.WithShards(shards)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	b := &testBundle{h: h, base: "http://" + ln.Addr().String(), tokens: map[string]string{"acme": token},
		http: &http.Client{Timeout: 40 * time.Second}, spec: openAPIValidator(t), started: true, orgA: "acme"}
	t.Cleanup(b.http.CloseIdleConnections)

	onB, onA := onPartition(2, 4, "mb"), onPartition(1, 4, "ma")
	b.grant(t, onB, 2)
	b.grant(t, onA, 2)
	r := b.propose(t, onB, "on-b", 100, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	statusOnB := []string{
		r.header.Get("Content-Location"),
		"/v1/orgs/acme/mandates/" + onB + "/proposals/on-b",
		"/v1/orgs/acme/mandates/" + onB + "/requests/" + r.header.Get("Request-Id"),
	}
	for _, path := range statusOnB {
		st := b.do(t, req{method: "GET", path: path, token: token})
		require.Equal(t, http.StatusOK, st.status, "%s as the documented role: %s", path, st.body)
	}
	ra := b.propose(t, onA, "on-a", 100, nil)
	require.Equal(t, http.StatusOK, ra.status, "%s", ra.body)
	authA := ra.header.Get("Content-Location")

	proxyA.Cut()
	for _, path := range statusOnB {
		start := time.Now()
		st := b.do(t, req{method: "GET", path: path, token: token})
		require.Equal(t, http.StatusOK, st.status, "%s with shard a cut off: %s", path, st.body)
		require.Less(t, time.Since(start), 3*time.Second, "%s is read on shard b only, not after shard a's timeout", path)
	}
	st := b.do(t, req{method: "GET", path: authA, token: token})
	st.problem(t, http.StatusServiceUnavailable, gateway.ReasonUnavailable)
	proxyA.Restore()

	// Partition 1 moves to shard b; the processors' map says so (they
	// follow when shard a refuses them).
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urls["a"], Target: urls["b"], TargetName: "b"})
	require.NoError(t, err)
	for _, path := range []string{procMap, gwMap} {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		moved, err := shardmap.MoveIn(raw, 1, "b", "")
		require.NoError(t, err)
		if path == gwMap {
			// The gateway's map changes a moment later: until then shard
			// a says the partition moved and the map still routes it there.
			st := b.do(t, req{method: "GET", path: authA, token: token})
			st.problem(t, http.StatusServiceUnavailable, gateway.ReasonUnavailable)
		}
		require.NoError(t, os.WriteFile(path, moved, 0o600))
	}
	begun := b.do(t, req{method: "POST", path: authA + "/begin", token: token, headers: map[string]string{"Executor": "w-after-move"}})
	require.Equal(t, http.StatusOK, begun.status, "decided on shard b: %s", begun.body)
	st = b.do(t, req{method: "GET", path: authA, token: token})
	require.Equal(t, http.StatusOK, st.status, "%s", st.body)
	require.Equal(t, "executing", st.json(t)["state"], "read on shard b (the copy left on a still says reserved)")
	req := b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/" + onA + "/requests/" + begun.header.Get("Request-Id"), token: token})
	require.Equal(t, http.StatusOK, req.status, "%s", req.body)
	require.Equal(t, "decided", req.json(t)["status"])
	require.Equal(t, string(wire.OutcomeExecuting), req.json(t)["decision"].(map[string]any)["outcome"])
}

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}
