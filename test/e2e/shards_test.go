package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestOperatorsRunTwoShardsFromAShardMapAndMandatectlReadsAcrossThem runs
// the mandated binary with --shard-map (shard a: partitions 0-1, its URL
// from a secret file; shard b: 2-3) and mandatectl with the same map:
// migrate migrates both, partitions and inspect read each partition where
// it lives, org-settings and tokens write the control shard only, and the
// daemon's partitions read the setting.
func TestOperatorsRunTwoShardsFromAShardMapAndMandatectlReadsAcrossThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := harness.New(t, harness.Options{Partitions: 4})
	urlA, urlB := testenv.Database(t), testenv.Database(t)
	shardMap := writeFile(t, "shards.yaml", fmt.Appendf(nil, `# two shards
shards:
  - name: a
    partitions: 0-1
    url_file: %s
  - name: b
    partitions: 2-3
    url: %q
`, writeSecret(t, urlA), urlB))

	mandatectl := procs.Binary(t, "mandatectl")
	ctl := func(args ...string) (string, int) {
		c := exec.Command(mandatectl, append(args, "--shard-map", shardMap)...)
		out, _ := c.CombinedOutput()
		return string(out), c.ProcessState.ExitCode()
	}
	out, code := ctl("migrate")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "shard a: schema is at version")
	require.Contains(t, out, "shard b: schema is at version")

	args := mandatedArgs(h)
	for i := range args {
		if args[i] == "--database-url" {
			args = append(args[:i], args[i+2:]...)
			break
		}
	}
	p := procs.StartMandated(t, "sharded", append(args, "--shard-map", shardMap), nil)
	p.WaitReady(2 * time.Minute)

	mandates := map[int32]string{}
	for i := 0; len(mandates) < 4; i++ {
		id := fmt.Sprintf("m%d", i)
		if n := partitioner.ForKey([]byte("acme/"+id), 4); mandates[n] == "" {
			mandates[n] = id
		}
	}
	for n := range int32(4) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", mandates[n], 5)).Outcome)
		require.Equal(t, wire.OutcomeReserved, h.SendAwait(proposeCmd("acme", mandates[n], fmt.Sprintf("k%d", n), 100)).Outcome)
	}

	out, code = ctl("partitions", "--json", "--brokers", joinComma(h.Brokers), "--proposals-topic", h.Spec.Proposals,
		"--grants-topic", h.Spec.Grants, "--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter, "--group", h.Group)
	require.Equal(t, 0, code, out)
	var parts []struct {
		Partition int32 `json:"partition"`
		NextSeq   int64 `json:"next_seq"`
	}
	require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "["):]), &parts), out)
	require.Len(t, parts, 4)
	for _, v := range parts {
		require.Equal(t, int64(3), v.NextSeq, "partition %d: both decisions, read from its own shard", v.Partition)
	}
	out, code = ctl("inspect", "mandate", "acme/"+mandates[3], "--json", "--no-history")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"uses_held": 1`, "a mandate of shard b is found there")

	out, code = ctl("org-settings", "set", "acme", "--replay-window", "10m", "--replay-policy", "deny")
	require.Equal(t, 0, code, out)
	out, code = ctl("tokens", "create", "acme", "--name", "shards", "--json")
	require.Equal(t, 0, code, out)
	var tok struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &tok), out)

	// The gateway with the same map: the token from the control shard,
	// each proposal's status from its mandate's shard.
	port, ops := procs.FreePort(t), procs.FreePort(t)
	gw := procs.Start(t, "gateway", procs.Binary(t, "mandate-gateway"), []string{"--shard-map", shardMap,
		"--brokers", joinComma(h.Brokers), "--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops)}, nil)
	gw.HTTP = fmt.Sprintf("127.0.0.1:%d", ops)
	gw.WaitReady(time.Minute)
	for _, n := range []int32{0, 3} {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/v1/orgs/acme/mandates/%s/proposals/k%d?operation=refund", port, mandates[n], n), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "partition %d: %s", n, body)
		require.Contains(t, string(body), `"outcome":"reserved"`, "partition %d's status is read in its shard", n)
	}
	poolA, poolB := pool(t, urlA), pool(t, urlB)
	for _, c := range []struct {
		pool *pgxpool.Pool
		want int
	}{{poolA, 1}, {poolB, 0}} {
		var settings, tokens int
		require.NoError(t, c.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM org_settings), (SELECT count(*) FROM gateway_tokens)`).Scan(&settings, &tokens))
		require.Equal(t, []int{c.want, c.want}, []int{settings, tokens}, "org settings and tokens live on the control shard (a) only")
	}
	// Shard b's partitions apply the control shard's replay setting: the
	// same refund again under another key is a possible replay.
	n := int32(3)
	b := h.SendAwait(cmd("begin", "acme", mandates[n], map[string]any{"authorization_id": h.Decisions.Wait(time.Minute, func(d wire.Decision) bool {
		return d.IdempotencyKey == fmt.Sprintf("k%d", n)
	}).AuthorizationID, "executor": "x"}))
	require.Equal(t, wire.OutcomeExecuting, b.Outcome, "%+v", b)
	testenv.WaitFor(t, time.Minute, func() bool {
		d := h.SendAwait(proposeCmd("acme", mandates[n], fmt.Sprintf("again-%d", time.Now().UnixNano()), 100))
		return d.Reason == wire.ReasonPossibleReplay
	}, "shard b's partition reads the replay window set on the control shard")
}

func pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
