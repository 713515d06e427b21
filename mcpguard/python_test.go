package mcpguard_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
)

// The agent is the official Python MCP SDK (no one here wrote its
// protocol code): eight concurrent calls of one intent, a restored agent,
// a second step the mandate does not allow, arguments failing the schema.
// It fails, never skips, when python3, venv or pip is missing
// (test/infra/run-tests.sh installs them); MANDATED_TEST_PYTHON=skip skips
// it on purpose.
func TestPythonAgent(t *testing.T) {
	t.Parallel()
	venv := pythonSDK(t, pythonSDKCurrent)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	b := setup(t)
	url, _ := b.guard(t, b.up.URL)
	b.grant(t, "case-py", 1, 30)
	script, err := filepath.Abs(filepath.Join("testdata", "agent.py"))
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, venv, script, url, "py", "order-py")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "agent.py:\n%s", stderr.String())

	type view struct {
		IsError    bool   `json:"is_error"`
		Text       string `json:"text"`
		Structured any    `json:"structured"`
		Outcome    string `json:"outcome"`
		Reason     string `json:"reason"`
		DecisionID string `json:"decision_id"`
	}
	var got struct {
		Tools        []string `json:"tools"`
		Concurrent   []view   `json:"concurrent"`
		Restored     view     `json:"restored"`
		SecondStep   view     `json:"second_step"`
		BadArguments view     `json:"bad_arguments"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	require.Equal(t, []string{"balance", "quote", "refund"}, got.Tools)
	require.Len(t, got.Concurrent, 8)
	outcomes := map[string]int{}
	for _, v := range got.Concurrent {
		require.False(t, v.IsError, "%s", v.Text)
		require.Equal(t, got.Concurrent[0].Text, v.Text)
		require.Equal(t, got.Concurrent[0].Structured, v.Structured)
		outcomes[v.Outcome]++
	}
	require.Equal(t, map[string]int{mcpguard.OutcomeExecuted: 1, mcpguard.OutcomeReplayed: 7}, outcomes)
	require.Contains(t, got.Concurrent[0].Text, "Refunded 1200 cents on order order-py.")
	require.False(t, got.Restored.IsError)
	require.Equal(t, mcpguard.OutcomeReplayed, got.Restored.Outcome)
	require.Equal(t, got.Concurrent[0].Text, got.Restored.Text)
	require.True(t, got.SecondStep.IsError)
	require.NotEmpty(t, got.SecondStep.Reason)
	require.Contains(t, got.SecondStep.Text, "decision "+got.SecondStep.DecisionID)
	require.True(t, got.BadArguments.IsError)
	require.Contains(t, got.BadArguments.Text, "do not match its input schema")
	require.Equal(t, 1, b.effects(t, "order-py"), "one refund in the ledger")
	require.Equal(t, int64(1), b.up.calls.Load())
	t.Logf("Python SDK agent (%s): 8 concurrent identical calls, %d effect(s), outcomes %v", pythonSDKCurrent, b.effects(t, "order-py"), outcomes)
}
