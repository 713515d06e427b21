package console_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway/console"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// waitKept waits until the relay has published and housekept n decisions
// of a mandate, so that the history keeps them.
func waitKept(t *testing.T, b *testBundle, org, mandate string, n int) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var got int
		require.NoError(t, b.rw.QueryRow(ctx, `SELECT count(*) FROM decision_history WHERE org = $1 AND mandate_id = $2`, org, mandate).Scan(&got))
		return got >= n
	}, fmt.Sprintf("%d decisions of %s/%s kept in decision_history", n, org, mandate))
}

// signIn signs the browser in with the operator token.
func signIn(t *testing.T, ctx context.Context, b *testBundle) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/login"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), b.operator)))
	submit(t, ctx, chromedp.Submit(chromedp.ID("token")), http.StatusOK)
}

// find types q into the search box (of the in-doubt queue's page) and
// returns where the search led (path, fragment, query) and its status.
func find(t *testing.T, ctx context.Context, b *testBundle, q string) (string, int64) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/"), chromedp.WaitVisible(chromedp.CSS(`input[name="q"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="q"]`), q)))
	resp, err := chromedp.RunResponse(ctx, chromedp.Submit(chromedp.CSS(`input[name="q"]`)))
	require.NoError(t, err)
	require.NotNil(t, resp, "the search loaded no page")
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	out := u.Path
	if u.Fragment != "" {
		out += "#" + u.Fragment
	}
	if u.RawQuery != "" {
		out += "?" + u.RawQuery
	}
	return out, resp.Status
}

// An operator finds any decision: decisions made by a real processor on
// real Kafka and PostgreSQL (two grants, a reservation under an intent, a
// repeat of it, the winning begin, a loser, the winner's begin again, a
// commit with a result, a denial, a conflict, a denial through the HTTP
// gateway) are kept once the relay has published them. In chromium: each
// kind of search leads to its authorization (or its decision, or a list),
// an authorization id pasted where a mandate was asked for is no longer a
// 400, the timeline counts the repeats and the loser and reads the result
// by its currency, the mandate's history pages through every decision
// newest first, and the overview draws the last hour. Screenshots 8-11.
func TestAnOperatorFindsAnyDecisionInARealBrowser(t *testing.T) {
	t.Parallel()
	b := setupWith(t, nil, console.Config{HistoryPage: 6})
	ctx := browser(t)
	shot := newShots(t)
	const org, m = "acme", "refund-case-2001"
	b.grant(t, org, m, 2)
	b.grant(t, org, m, 3) // its terms' second version
	send := func(cmd map[string]any) wire.Decision {
		t.Helper()
		cmd["org"], cmd["mandate_id"] = org, m
		return b.h.SendAwait(cmd)
	}
	refund := func(key string, minor int64) map[string]any {
		return map[string]any{"type": "propose", "idempotency_key": key, "operation": "payment.refund", "target": "customer-77",
			"amount": map[string]any{"minor_units": minor, "currency": "EUR"},
			"intent": map[string]any{"run_id": "run-7f3a", "step": "3", "action": "refund:customer-77"}}
	}
	reserved := send(refund("k-2001", 15000))
	require.Equal(t, wire.OutcomeReserved, reserved.Outcome, "%s", reserved.Detail)
	auth := reserved.AuthorizationID
	require.Equal(t, wire.OutcomeReplayed, send(refund("k-2001-regenerated", 15000)).Outcome, "the same intent again")
	begin := func(executor string) wire.Decision {
		return send(map[string]any{"type": "begin", "authorization_id": auth, "executor": executor})
	}
	won := begin("worker-a.attempt-1")
	require.Equal(t, wire.OutcomeExecuting, won.Outcome)
	lost := begin("worker-b.attempt-1")
	require.Equal(t, wire.ReasonAlreadyExecuting, lost.Reason)
	require.Equal(t, wire.OutcomeReplayed, begin("worker-a.attempt-1").Outcome)
	committed := send(map[string]any{"type": "commit", "authorization_id": auth, "external_ref": "re_9Zk2",
		"execution_token": won.ExecutionToken, "result": map[string]any{"refund_id": "re_9Zk2", "status": "succeeded",
			"amount": map[string]any{"minor_units": 15000, "currency": "EUR"}}})
	require.Equal(t, wire.OutcomeCommitted, committed.Outcome, "%s", committed.Detail)
	tooMuch := refund("k-too-much", 50000)
	delete(tooMuch, "intent")
	denied := send(tooMuch)
	require.Equal(t, wire.ReasonAmountExceedsMax, denied.Reason)
	conflict := refund("k-2001", 12000)
	delete(conflict, "intent")
	require.Equal(t, wire.OutcomeConflict, send(conflict).Outcome)
	// Through the HTTP gateway: its request id names its record.
	req, err := http.NewRequest(http.MethodPost, b.base+"/v1/orgs/acme/mandates/"+m+"/proposals",
		strings.NewReader(`{"operation":"payment.refund","amount":{"minor_units":90000,"currency":"EUR"},"target":"customer-77"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.apiToken)
	req.Header.Set("Idempotency-Key", "k-http")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Contains(t, []int{http.StatusOK, http.StatusAccepted}, resp.StatusCode)
	requestID := resp.Header.Get("Request-Id")
	require.NotEmpty(t, requestID)
	b.grant(t, org, "refund-case-2002", 2)
	other := refund("k-2002", 15000) // another step of the same run, on another mandate
	other["mandate_id"], other["org"] = "refund-case-2002", org
	other["intent"].(map[string]any)["step"] = "4"
	require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(other).Outcome)
	b.inDoubt(t, org, "refund-case-2002", "worker-z.attempt-1")

	// Every decision about the mandate, as the decisions topic has them.
	var all []wire.Decision
	testenv.WaitFor(t, time.Minute, func() bool {
		all = slices.DeleteFunc(b.h.Decisions.All(), func(d wire.Decision) bool { return d.MandateKey != org+"/"+m })
		return len(all) == 11
	}, "the 11 decisions of the mandate on the decisions topic")
	waitKept(t, b, org, m, len(all))
	waitKept(t, b, org, "refund-case-2002", 5)
	slices.SortFunc(all, func(a, b wire.Decision) int {
		return -cmp.Or(a.DecidedAt.Compare(b.DecidedAt), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Sequence, b.Sequence))
	})
	byKey := func(key string) wire.Decision {
		for _, d := range all {
			if d.IdempotencyKey == key {
				return d
			}
		}
		t.Fatalf("no decision under key %s", key)
		return wire.Decision{}
	}
	httpDenial, replayed := byKey("k-http"), byKey("k-2001-regenerated")

	signIn(t, ctx, b)
	timeline := "/console/authorizations/acme/" + m + "/" + auth

	// The authorization id, where the first console asked for a mandate:
	// no longer a 400.
	resp2, err := chromedp.RunResponse(ctx, chromedp.Navigate(b.base+"/console/mandates?key="+auth))
	require.NoError(t, err)
	require.EqualValues(t, http.StatusOK, resp2.Status)
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(loc, timeline), loc)

	// Each kind of search, typed into the box.
	for _, c := range []struct {
		name, q, want string
		status        int64
	}{
		{"an authorization id", auth, timeline, http.StatusOK},
		{"an idempotency key under a regenerated intent", "k-2001-regenerated", timeline + "#d-" + replayed.DecisionID, http.StatusOK},
		{"an idempotency key a conflict reused", "k-2001", timeline, http.StatusOK},
		{"an executor", "worker-a.attempt-1", timeline + "#d-" + won.DecisionID, http.StatusOK},
		{"a provider's reference", "re_9Zk2", timeline + "#d-" + committed.DecisionID, http.StatusOK},
		{"a decision id (partition-sequence)", lost.DecisionID, timeline + "#d-" + lost.DecisionID, http.StatusOK},
		{"the record a decision answers (proposals partition@offset)", fmt.Sprintf("proposals %d@%d", won.Source.Partition, won.Source.Offset),
			timeline + "#d-" + won.DecisionID, http.StatusOK},
		{"the record on the proposals topic", fmt.Sprintf("proposals %d@%d", denied.Source.Partition, denied.Source.Offset),
			"/console/decisions/" + denied.DecisionID, http.StatusOK},
		{"a denial's idempotency key: the decision", "k-too-much", "/console/decisions/" + denied.DecisionID, http.StatusOK},
		{"a gateway request id", requestID, "/console/decisions/" + httpDenial.DecisionID, http.StatusOK},
		{"a mandate", org + "/" + m, "/console/mandates/acme/" + m, http.StatusOK},
		{"an intent's run id, two steps on two mandates: a list", "run-7f3a", "/console/search?q=run-7f3a", http.StatusOK},
		{"an intent's run id, named", "intent:run-7f3a", "/console/search?q=intent%3Arun-7f3a", http.StatusOK},
		{"nothing kept", "k-never-used", "/console/search?q=k-never-used", http.StatusNotFound},
	} {
		got, status := find(t, ctx, b, c.q)
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, c.status, status, c.name)
		switch c.name {
		case "an intent's run id, two steps on two mandates: a list":
			links, err := chromedp.Run(ctx, chromedp.AttributesAll(chromedp.CSSAll(`table.decisions tbody tr td:nth-child(5) a`)))
			require.NoError(t, err)
			require.Len(t, links, 2, "the two authorizations of the run")
			require.Equal(t, timeline, links[1]["href"], "the older one: refund-case-2001's")
			shot.take(t, ctx, "10-search")
		case "nothing kept":
			require.Contains(t, text(t, ctx, "main"), "Nothing kept matches")
		case "a denial's idempotency key: the decision":
			page := text(t, ctx, "main")
			require.Contains(t, page, "amount_exceeds_max")
			require.Contains(t, page, "The decision as published")
		case "a mandate":
			mandate := text(t, ctx, "main")
			require.Contains(t, mandate, "Latest decisions")
			require.Contains(t, mandate, "amount_exceeds_max")
		}
	}

	// A record's position without its topic: the grants topic may have a
	// record there too, so it lists both or leads to the one.
	got, status := find(t, ctx, b, fmt.Sprintf("%d@%d", won.Source.Partition, won.Source.Offset))
	require.EqualValues(t, http.StatusOK, status, got)
	require.Contains(t, text(t, ctx, "main"), won.DecisionID)

	// The timeline: propose → reserve → begin → commit, who and when, the
	// repeats and the loser counted, the result by its currency.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+timeline), chromedp.WaitVisible(chromedp.CSS("ol.flow"))))
	flow := text(t, ctx, "ol.flow")
	for _, want := range []string{"propose → reserve", "begin", "commit", "executor worker-a.attempt-1", "1 loser, 1 repeat", "re_9Zk2"} {
		require.Contains(t, flow, want)
	}
	counts := text(t, ctx, ".counts")
	for _, want := range []string{"7 decisions", "1 repeated proposals", "1 losing begins", "1 repeated begins", "1 refused or in conflict"} {
		require.Contains(t, counts, want)
	}
	result := text(t, ctx, "dl.result")
	for _, want := range []string{"amount", "150.00 EUR", "refund_id", "re_9Zk2", "status", "succeeded"} {
		require.Contains(t, result, want)
	}
	page := text(t, ctx, "main")
	require.NotContains(t, page, "15000", "amounts by the currency's exponent, never minor units")
	for _, want := range []string{"run-7f3a", "another executor (named in its command)", "lost: executor worker-a.attempt-1 holds the execution",
		"idempotency_key_reused"} {
		require.Contains(t, page, want)
	}
	shot.take(t, ctx, "9-timeline")

	// The mandate's history, page after page: every decision, newest first.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/mandates/acme/"+m+"/history"),
		chromedp.WaitVisible(chromedp.CSS("table.decisions"))))
	shot.take(t, ctx, "8-history")
	var seen []string
	for page := 0; ; page++ {
		require.Less(t, page, 5, "the history ends")
		rows, err := chromedp.Run(ctx, chromedp.AttributesAll(chromedp.CSSAll(`table.decisions tbody tr`)))
		require.NoError(t, err)
		require.LessOrEqual(t, len(rows), 6)
		for _, r := range rows {
			seen = append(seen, r["id"])
		}
		older, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll(`a.older`), chromedp.AtLeast(0)))
		require.NoError(t, err)
		if len(older) == 0 {
			break
		}
		submit(t, ctx, chromedp.Click(chromedp.CSS(`a.older`), chromedp.NodeVisible), http.StatusOK)
	}
	var want []string
	for _, d := range all {
		want = append(want, "d-"+d.DecisionID)
	}
	require.Equal(t, want, seen, "every decision once, newest first")

	// The overview: the last hour by outcome, the denials by reason, what
	// is in doubt now.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.base+"/console/overview"), chromedp.WaitVisible(chromedp.CSS("svg.chart"))))
	bars, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll(`svg.chart rect`)))
	require.NoError(t, err)
	require.NotEmpty(t, bars)
	overview := text(t, ctx, "main")
	for _, want := range []string{"In doubt now", "amount_exceeds_max", "already_executing", "idempotency_key_reused", "refund-case-2002", "Reconcile"} {
		require.Contains(t, overview, want)
	}
	require.Contains(t, text(t, ctx, ".stats .alert"), "1")
	shot.take(t, ctx, "11-overview")
}
