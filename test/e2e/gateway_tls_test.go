package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestTheGatewayServesTLSAndItsOperationsOnAListenerOfTheirOwn runs the
// mandate-gateway binary with --tls-cert/--tls-key from a CA the test
// makes and --ops-addr: the API answers over HTTPS only (a client that
// does not trust the CA is refused, plain HTTP gets nothing), errors
// answered before the handler are problem details over TLS too, /metrics
// and /readyz are on the ops listener and not on the API's, and a rotated
// certificate is served to the next connection without a restart.
func TestTheGatewayServesTLSAndItsOperationsOnAListenerOfTheirOwn(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 2})
	h.Start("a")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, h.DatabaseURL)
	require.NoError(t, err)
	_, token, err := gateway.CreateToken(ctx, conn, "acme", "tls")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", "m-tls", 1)).Outcome)

	ca := newCA(t, "gateway-ca")
	certPEM, keyPEM := ca.serverCert(t, net.ParseIP("127.0.0.1"))
	certFile, keyFile := writeFile(t, "gw.crt", certPEM), writeFile(t, "gw.key", keyPEM)
	api, ops := procs.FreePort(t), procs.FreePort(t)
	gw := procs.Start(t, "gateway", procs.Binary(t, "mandate-gateway"), []string{
		"--database-url", h.DatabaseURL, "--brokers", joinComma(h.Brokers),
		"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants, "--decisions-topic", h.Spec.Decisions,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", api), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops),
		"--tls-cert", certFile, "--tls-key", keyFile, "--log-format", "json",
	}, nil)
	gw.HTTP = fmt.Sprintf("127.0.0.1:%d", ops)
	gw.WaitReady(time.Minute)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	trusting := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	base := fmt.Sprintf("https://127.0.0.1:%d", api)

	req, err := http.NewRequest(http.MethodPost, base+"/v1/orgs/acme/mandates/m-tls/proposals",
		strings.NewReader(`{"operation":"refund","amount":{"minor_units":100,"currency":"EUR"},"target":"t"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "tls-1")
	req.Header.Set("Prefer", "wait=20")
	resp, err := trusting.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.NotEmpty(t, resp.Header.Get("Request-Id"))
	require.GreaterOrEqual(t, resp.TLS.Version, uint16(tls.VersionTLS12))

	_, err = (&http.Client{Timeout: 10 * time.Second}).Get(base + "/v1/openapi.yaml")
	require.ErrorContains(t, err, "certificate", "a client that does not trust the CA is refused")
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/v1/openapi.yaml", api)); err == nil {
		resp.Body.Close()
		require.NotEqual(t, http.StatusOK, resp.StatusCode, "plain HTTP is not served on the TLS port")
	}

	// Oversized headers over TLS: a problem, written inside the TLS session.
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", api), &tls.Config{RootCAs: roots})
	require.NoError(t, err)
	_, err = io.WriteString(c, "GET /v1/openapi.yaml HTTP/1.1\r\nHost: x\r\nX-Padding: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
	require.NoError(t, err)
	big, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	var p map[string]any
	require.NoError(t, json.NewDecoder(big.Body).Decode(&p))
	c.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, big.StatusCode)
	require.Equal(t, "application/problem+json", big.Header.Get("Content-Type"))
	require.Equal(t, string(gateway.ReasonHeadersTooLarge), p["reason"])

	// The operations listener has the metrics; the API does not.
	code, metrics, err := gw.Get("/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, `mandated_gateway_requests_total{code="200",route="propose"} 1`)
	resp, err = trusting.Get(base + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))

	// A rotated certificate is served to the next connection.
	certPEM2, keyPEM2 := ca.serverCert(t, net.ParseIP("127.0.0.1"))
	require.NoError(t, os.WriteFile(keyFile, keyPEM2, 0o600))
	require.NoError(t, os.WriteFile(certFile, certPEM2, 0o600))
	block, _ := pem.Decode(certPEM2)
	testenv.WaitFor(t, 30*time.Second, func() bool {
		c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", api), &tls.Config{RootCAs: roots})
		if err != nil {
			return false
		}
		defer c.Close()
		return string(c.ConnectionState().PeerCertificates[0].Raw) == string(block.Bytes)
	}, "the rotated certificate is served")
}
