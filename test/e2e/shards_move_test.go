package e2e

import (
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
	"github.com/mandated/mandated/processor/wire"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
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

	mandate := ""
	for i := 0; mandate == ""; i++ {
		if id := fmt.Sprintf("m%d", i); partitioner.ForKey([]byte("acme/"+id), 4) == 1 {
			mandate = id
		}
	}
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", mandate, 5)).Outcome)
	before := h.SendAwait(proposeCmd("acme", mandate, "before", 100))
	require.Equal(t, wire.OutcomeReserved, before.Outcome)

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
	port := procs.FreePort(t)
	gw := procs.Start(t, "gateway", procs.Binary(t, "mandate-gateway"), []string{"--shard-map", shardMap,
		"--brokers", joinComma(h.Brokers), "--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--http-addr", fmt.Sprintf("127.0.0.1:%d", port)}, nil)
	gw.HTTP = fmt.Sprintf("127.0.0.1:%d", port)
	gw.WaitReady(time.Minute)
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/v1/orgs/acme/mandates/%s/proposals/before?operation=refund", gw.HTTP, mandate), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), `"state":"executing"`, "the gateway reads shard b, not the copy left on a: %s", body)

	out, code = ctl("shards", "drop-moved", "1", "--shard", "a")
	require.Equal(t, 0, code, out)
	var left int
	require.NoError(t, pool(t, urlA).QueryRow(t.Context(), `SELECT count(*) FROM authorizations WHERE partition = 1`).Scan(&left))
	require.Zero(t, left)
}
