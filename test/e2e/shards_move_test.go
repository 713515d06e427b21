package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestOperatorsMoveAPartitionWithMandatectlAndTheDaemonFollowsOnSIGHUP
// runs the binaries: mandated with a two-shard map (a: 0-1, b: 2-3), a
// proposal reserved on partition 1, then `mandatectl shards move 1 --to b`
// and SIGHUP. The reservation made before the move begins on shard b, its
// key replays there, the gateway reads its status on b (not the read-only
// copy left on a), and drop-moved deletes that copy.
func TestOperatorsMoveAPartitionWithMandatectlAndTheDaemonFollowsOnSIGHUP(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 4})
	urlA, urlB := testenv.Database(t), testenv.Database(t)
	shardMap := writeFile(t, "shards.yaml", fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB))
	mandatectl := procs.Binary(t, "mandatectl")
	ctl := func(args ...string) (string, int) {
		c := exec.Command(mandatectl, append(args, "--shard-map", shardMap)...)
		out, _ := c.CombinedOutput()
		return string(out), c.ProcessState.ExitCode()
	}
	out, code := ctl("migrate")
	require.Equal(t, 0, code, out)
	args := mandatedArgs(h)
	for i := range args {
		if args[i] == "--database-url" {
			args = append(args[:i], args[i+2:]...)
			break
		}
	}
	p := procs.StartMandated(t, "sharded", append(args, "--shard-map", shardMap), nil)
	p.WaitReady(2 * time.Minute)

	on := func(p int32) string {
		for i := 0; ; i++ {
			if id := fmt.Sprintf("m%d", i); partitioner.ForKey([]byte("acme/"+id), 4) == p {
				return id
			}
		}
	}
	mandate, other := on(1), on(2)
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", mandate, 5)).Outcome)
	before := h.SendAwait(proposeCmd("acme", mandate, "before", 100))
	require.Equal(t, wire.OutcomeReserved, before.Outcome)
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", other, 5)).Outcome)
	otherBefore := h.SendAwait(proposeCmd("acme", other, "other-before", 100)) // keys are unique per org and operation in a database
	require.Equal(t, wire.OutcomeReserved, otherBefore.Outcome)

	out, code = ctl("shards", "move", "1", "--to", "b")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "partition 1 moved from shard a to shard b")
	p.Signal(syscall.SIGHUP)
	testenv.WaitFor(t, time.Minute, func() bool { return strings.Contains(p.Log(), "shard map reloaded") }, "SIGHUP reloads the map")

	begun := h.SendAwait(cmd("begin", "acme", mandate, map[string]any{"authorization_id": before.AuthorizationID, "executor": "x"}))
	require.Equal(t, wire.OutcomeExecuting, begun.Outcome, "the reservation made before the move is on shard b: %+v", begun)
	again := h.SendAwait(proposeCmd("acme", mandate, "before", 100))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "its key replays on shard b: %+v", again)
	require.Equal(t, before.AuthorizationID, again.AuthorizationID)

	out, code = ctl("tokens", "create", "acme", "--name", "move")
	require.Equal(t, 0, code, out)
	token := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	port, ops := procs.FreePort(t), procs.FreePort(t)
	gw := procs.Start(t, "gateway", procs.Binary(t, "mandate-gateway"), []string{"--shard-map", shardMap,
		"--brokers", joinComma(h.Brokers), "--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops)}, nil)
	gw.HTTP = fmt.Sprintf("127.0.0.1:%d", ops)
	gw.WaitReady(time.Minute)
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/v1/orgs/acme/mandates/%s/proposals/before?operation=refund", port, mandate), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), `"state":"executing"`, "the gateway reads shard b, not the copy left on a: %s", body)

	// Back the other way, from shard b to the control shard a: verify
	// reads partition 2 on a, not the copy left on b.
	out, code = ctl("shards", "move", "2", "--to", "a")
	require.Equal(t, 0, code, out)
	p.Signal(syscall.SIGHUP)
	begun = h.SendAwait(cmd("begin", "acme", other, map[string]any{"authorization_id": otherBefore.AuthorizationID, "executor": "x"}))
	require.Equal(t, wire.OutcomeExecuting, begun.Outcome, "%+v", begun)
	done := h.SendAwait(cmd("commit", "acme", other, map[string]any{"authorization_id": otherBefore.AuthorizationID,
		"external_ref": "re_1", "execution_token": begun.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, done.Outcome, "%+v", done)
	out, code = ctl("verify", "--json", "--brokers", joinComma(h.Brokers), "--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter)
	require.Equal(t, 0, code, "verify after the moves: %s", out)
	var report struct {
		Partitions []struct {
			Partition int32 `json:"partition"`
			Target    int64 `json:"target_sequence"`
			Decisions int64 `json:"decisions"`
		} `json:"partitions"`
		Drifts []any `json:"drifts"`
	}
	require.NoError(t, json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &report), out)
	require.Empty(t, report.Drifts)
	seen := map[int32]int{}
	for _, pr := range report.Partitions {
		seen[pr.Partition]++
		if pr.Partition == 1 || pr.Partition == 2 {
			require.Equal(t, pr.Decisions, pr.Target, "partition %d is verified against its live shard's sequence: %s", pr.Partition, out)
		}
	}
	require.Equal(t, 1, seen[1], "a moved partition is verified once: %s", out)
	require.Equal(t, 1, seen[2], "%s", out)

	out, code = ctl("shards", "drop-moved", "1", "--shard", "a")
	require.Equal(t, 0, code, out)
	var left int
	require.NoError(t, pool(t, urlA).QueryRow(t.Context(), `SELECT count(*) FROM authorizations WHERE partition = 1`).Scan(&left))
	require.Zero(t, left)
}
