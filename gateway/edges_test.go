package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/wire"
)

// bare serves a gateway without Kafka or PostgreSQL: enough for what is
// answered before any handler reads them.
func bare(t *testing.T, cfg gateway.Config) string {
	t.Helper()
	srv, err := gateway.New(cfg, nil, nil, nil)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	return ln.Addr().String()
}

// raw writes bytes on a new connection and reads the response.
func raw(t *testing.T, addr, request string) (*http.Response, map[string]any) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var p map[string]any
	require.NoError(t, json.Unmarshal(body, &p), "not JSON: %q", body)
	return resp, p
}

// Errors net/http answers before any handler runs are problem details too,
// with a reason a client can branch on.
func TestGatewayErrorsBeforeTheHandlerAreProblemDetails(t *testing.T) {
	t.Parallel()
	addr := bare(t, gateway.Config{MaxHeaderBytes: 4096})
	for _, tc := range []struct {
		name    string
		request string
		status  int
		reason  wire.Reason
	}{
		{"headers over the limit are 431", "GET /v1/openapi.yaml HTTP/1.1\r\nHost: x\r\nX-Padding: " + strings.Repeat("a", 16<<10) + "\r\n\r\n",
			http.StatusRequestHeaderFieldsTooLarge, gateway.ReasonHeadersTooLarge},
		{"a NUL in a header is 400", "GET /v1/openapi.yaml HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n", http.StatusBadRequest, wire.ReasonHeaderInvalid},
		{"a malformed request line is 400", "GET\r\n\r\n", http.StatusBadRequest, gateway.ReasonMalformedRequest},
		{"an unsupported transfer coding is 501", "POST /v1/openapi.yaml HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", http.StatusNotImplemented, gateway.ReasonMalformedRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, p := raw(t, addr, tc.request)
			require.Equal(t, tc.status, resp.StatusCode)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			require.Equal(t, string(tc.reason), p["reason"])
			require.Equal(t, "urn:mandated:reason:"+string(tc.reason), p["type"])
			require.EqualValues(t, tc.status, p["status"])
		})
	}
	// The connection-level rewrite leaves ordinary answers alone.
	resp, p := raw(t, addr, "GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Equal(t, string(gateway.ReasonNotFound), p["reason"])
}

// A route asked with the wrong method is 405 with Allow, not 404.
func TestGatewayMethodMismatchIs405WithAllow(t *testing.T) {
	t.Parallel()
	base := "http://" + bare(t, gateway.Config{})
	for _, tc := range []struct{ method, path, allow string }{
		{"DELETE", "/v1/orgs/acme/mandates/m/proposals", "POST"},
		{"GET", "/v1/orgs/acme/mandates/m/authorizations/au_1/begin", "POST"},
		{"POST", "/v1/orgs/acme/mandates/m/authorizations/au_1", "GET, HEAD"},
		{"PUT", "/v1/orgs/acme/mandates/m/requests/rq-1-2-x", "GET, HEAD"},
		{"POST", "/v1/openapi.yaml", "GET, HEAD"},
	} {
		r, err := http.NewRequest(tc.method, base+tc.path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(r)
		require.NoError(t, err)
		var p map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", tc.method, tc.path)
		require.Equal(t, tc.allow, resp.Header.Get("Allow"), "%s %s", tc.method, tc.path)
		require.Equal(t, string(gateway.ReasonMethodNotAllowed), p["reason"])
	}
}

// Prefer: wait beyond what a time.Duration holds is bounded by MaxWait,
// not wrapped around to an immediate 202.
func TestGatewayPreferWaitOverflowIsClampedToMaxWait(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true, cfg: gateway.Config{MaxWait: 2 * time.Second, DefaultWait: time.Second}})
	b.grant(t, "m-wait", 1)
	b.h.Stop(b.inst)
	for _, wait := range []string{"wait=10000000000", "wait=99999999999999999999999"} {
		start := time.Now()
		r := b.propose(t, "m-wait", "wait-1", 100, map[string]string{"Prefer": wait})
		require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
		require.Equal(t, "wait=2", r.header.Get("Preference-Applied"))
		require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "%s waited MaxWait", wait)
	}
}
