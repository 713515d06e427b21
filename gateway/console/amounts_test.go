package console_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// page GETs a console page with the operator's token as a bearer token
// and returns its status and HTML.
func (b *testBundle) page(t *testing.T, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", b.base+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.operator)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// Amounts are minor units on the wire and whole units on a page: 15000
// EUR minor units are 150.00 EUR, never "15000 EUR".
func TestTheConsoleShowsAmountsByTheCurrencysExponent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t, "acme", "m-amounts", 2)
	auth := b.inDoubt(t, "acme", "m-amounts", "worker-1")

	waitKept(t, b, "acme", "m-amounts", 4)
	for _, path := range []string{"/console/", "/console/mandates/acme/m-amounts", "/console/reconcile/acme/m-amounts/" + auth,
		"/console/mandates/acme/m-amounts/history", "/console/authorizations/acme/m-amounts/" + auth} {
		code, html := b.page(t, path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, html)
		require.Contains(t, html, "150.00 EUR", "%s shows the authorization's amount in euros", path)
		require.NotContains(t, html, "15000 EUR", "%s shows no minor units as euros", path)
	}
	_, html := b.page(t, "/console/mandates/acme/m-amounts")
	require.Contains(t, html, "at most 200.00 EUR", "the grant's cap per use")
	require.NotContains(t, html, "20000 EUR")
	_, html = b.page(t, "/console/mandates/acme/m-amounts/history")
	require.Contains(t, html, "version 1: 2 uses of at most 200.00 EUR", "the grant, in the history")
}
