package console_test

import (
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway"
)

// A resolved in-doubt execution keeps its story on the mandate's page:
// who resolved it (the operator who sent the resolve from the console),
// the evidence they gave, and what the executor reported when it went in
// doubt (which used to vanish: the evidence overwrote it).
func TestTheMandatePageKeepsWhoResolvedTheEvidenceAndWhatWasReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t, "acme", "m-story", 1)
	auth := b.inDoubt(t, "acme", "m-story", "worker-story")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var operatorID string
	ts, err := gateway.ListTokens(ctx, b.rw, "")
	require.NoError(t, err)
	for _, tk := range ts {
		if tk.Kind == gateway.KindOperator {
			operatorID = tk.ID
		}
	}
	require.NotEmpty(t, operatorID)

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	hc := &http.Client{Timeout: time.Minute, Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path string, form url.Values) *http.Response {
		t.Helper()
		req, err := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", b.base)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	require.Equal(t, http.StatusSeeOther, post("/console/login", url.Values{"token": {b.operator}}).StatusCode)
	resolved := post("/console/reconcile/acme/m-story/"+auth, url.Values{"csrf": {csrfOf(t, b, hc)}, "outcome": {"committed"},
		"external_ref": {"re_story"}, "evidence": {"the provider lists refund re_story at 08:12Z"}})
	require.Equal(t, http.StatusOK, resolved.StatusCode)
	require.Equal(t, "committed", authRow(t, b, "acme", "m-story", auth).state)

	code, html := b.page(t, "/console/mandates/acme/m-story")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, html, "provider timed out after 30 s", "what the executor reported is still shown")
	require.Contains(t, html, "the provider lists refund re_story at 08:12Z", "the evidence")
	require.Contains(t, html, "console:"+operatorID, "who resolved it")
}
