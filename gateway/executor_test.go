package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

func (b *testBundle) reserve(t *testing.T, mandate, key string) string {
	t.Helper()
	r := b.propose(t, mandate, key, 15000, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "reserved", r.json(t)["outcome"])
	return "/v1/orgs/acme/mandates/" + mandate + "/authorizations/" + r.json(t)["authorization_id"].(string)
}

// The probe's workers derive their keys from workflow facts, as the README
// advises, so all eight send the same Idempotency-Key on begin. The key is
// the intent's, never the executor: each begin is its own attempt, one
// wins, and no loser is answered 200 executing.
func TestGatewayBeginsUnderOneIdempotencyKeyElectOneExecutor(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-exec", 1)
	auth := b.reserve(t, "m-exec", "approval-7")
	key := wire.IntentKey("run-7", "3", "payment.refund")

	const n = 8
	answers := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = b.do(t, req{method: "POST", path: auth + "/begin", token: b.tokens["acme"], body: []byte(`{}`),
				headers: map[string]string{"Idempotency-Key": key}})
		}()
	}
	wg.Wait()
	var codes []int
	winners := 0
	for _, r := range answers {
		codes = append(codes, r.status)
		if r.status == http.StatusOK && r.json(t)["authorization"].(map[string]any)["state"] == "executing" {
			winners++
		}
	}
	require.Equal(t, 1, winners, "one begin is told to execute; statuses %v", codes)
	executors := map[string]bool{}
	for i, r := range answers {
		ex := r.header.Get("Executor")
		require.NotEmpty(t, ex, "answer %d names the executor the gateway minted for the attempt", i)
		require.NotEqual(t, key, ex)
		executors[ex] = true
		if r.status == http.StatusOK {
			require.Equal(t, "executing", r.json(t)["outcome"], "%s", r.body)
			continue
		}
		p := r.problem(t, http.StatusConflict, wire.ReasonAlreadyExecuting)
		held := p["decision"].(map[string]any)["authorization"].(map[string]any)
		require.Equal(t, "executing", held["state"], "the loser is shown the winner's execution")
	}
	require.Len(t, executors, n, "every attempt is its own executor")
}

// The executor comes from the Executor header or the body's "executor";
// the winner's retry with its executor is its own answer again (replayed,
// still 200), and a begin with no body at all is taken (the document says
// the body is optional) with an executor the gateway mints.
func TestGatewayExecutorFromHeaderOrBodyOrMinted(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-ex2", 3)
	tok := b.tokens["acme"]

	// In the body, without the header.
	auth := b.reserve(t, "m-ex2", "k-body")
	r := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, body: []byte(`{"executor":"worker-a.1"}`)})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "executing", r.json(t)["outcome"])
	require.Equal(t, "worker-a.1", r.header.Get("Executor"))
	require.Equal(t, "worker-a.1", r.json(t)["authorization"].(map[string]any)["executor"])
	// The same attempt again (its answer was lost): its own execution, replayed.
	again := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "worker-a.1"}})
	require.Equal(t, http.StatusOK, again.status, "%s", again.body)
	require.Equal(t, "replayed", again.json(t)["outcome"])
	require.Equal(t, "executing", again.json(t)["original_outcome"])
	// Another attempt is a loser.
	other := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "worker-b.1"}})
	other.problem(t, http.StatusConflict, wire.ReasonAlreadyExecuting)

	// Header and body disagree: refused before producing.
	auth2 := b.reserve(t, "m-ex2", "k-both")
	b.do(t, req{method: "POST", path: auth2 + "/begin", token: tok, body: []byte(`{"executor":"w-1"}`),
		headers: map[string]string{"Executor": "w-2"}}).problem(t, http.StatusBadRequest, wire.ReasonFieldInvalid)
	// An executor outside the id grammar: the decoder's reason.
	b.do(t, req{method: "POST", path: auth2 + "/begin", token: tok, headers: map[string]string{"Executor": "w 1"}, invalid: true}).
		problem(t, http.StatusBadRequest, wire.ReasonIDInvalid)

	// No body, no Content-Type, no executor: minted and returned.
	none := b.do(t, req{method: "POST", path: auth2 + "/begin", token: tok})
	require.Equal(t, http.StatusOK, none.status, "%s", none.body)
	minted := none.header.Get("Executor")
	require.Regexp(t, `^gw-[a-z2-7]{26}$`, minted)
	require.Equal(t, minted, none.json(t)["authorization"].(map[string]any)["executor"])
	require.Equal(t, fmt.Sprint(none.json(t)["execution_token"]), fmt.Sprint(none.json(t)["authorization"].(map[string]any)["execution_token"]))
}

// A reconciled execution over HTTP: the reconciler's resolve (on the
// grants topic) carries the provider's result; the authorization's status
// shows it; a loser's begin is shown it; and the woken executor's own
// begin again is 409 terminal_state with the committed state, never 200
// "replayed, executing".
func TestGatewayReconciledExecutionShowsTheResolvesResult(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-rec", 1)
	tok := b.tokens["acme"]
	auth := b.reserve(t, "m-rec", "k-rec")
	begun := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "worker-1"}})
	require.Equal(t, http.StatusOK, begun.status, "%s", begun.body)
	token := begun.json(t)["execution_token"]
	unknown := b.do(t, req{method: "POST", path: auth + "/report-unknown", token: tok,
		body: []byte(fmt.Sprintf(`{"execution_token":%v,"detail":"provider timed out"}`, token))})
	require.Equal(t, http.StatusOK, unknown.status, "%s", unknown.body)
	id := begun.json(t)["authorization_id"].(string)

	const result = `{"refund":"re_rec","status":"succeeded"}`
	d := b.h.SendAwait(map[string]any{"type": "resolve", "org": "acme", "mandate_id": "m-rec", "authorization_id": id,
		"outcome": "committed", "external_ref": "re_rec", "evidence": "provider lists the refund", "result": json.RawMessage(result),
		"reconciler": "mandatectl:ops"})
	require.Equal(t, wire.OutcomeCommitted, d.Outcome, "%s: %s", d.Reason, d.Detail)

	status := b.do(t, req{method: "GET", path: auth, token: tok})
	require.Equal(t, http.StatusOK, status.status, "%s", status.body)
	got, _ := json.Marshal(status.json(t)["result"])
	require.JSONEq(t, result, string(got), "the status shows the reconciled result: %s", status.body)
	st := status.json(t)
	require.Equal(t, true, st["resolved"], "%s", status.body)
	require.Equal(t, "mandatectl:ops", st["resolved_by"], "who resolved it")
	require.Equal(t, "provider lists the refund", st["detail"], "the evidence")
	require.Equal(t, "provider timed out", st["reported"], "what was reported when it went in doubt")

	loser := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "worker-2"}})
	held := loser.problem(t, http.StatusConflict, wire.ReasonAlreadyExecuting)["decision"].(map[string]any)["authorization"].(map[string]any)
	got, _ = json.Marshal(held["result"])
	require.JSONEq(t, result, string(got), "a loser is shown the reconciled result")

	again := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "worker-1"}})
	p := again.problem(t, http.StatusConflict, wire.ReasonTerminal)
	dec := p["decision"].(map[string]any)
	require.NotEqual(t, "executing", dec["original_outcome"])
	require.Equal(t, "committed", dec["authorization"].(map[string]any)["state"])
}
