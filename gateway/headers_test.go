package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/wire"
)

// A single-valued header sent twice is as ambiguous as a duplicate JSON
// member: a proxy in front of the gateway may have read the other one.
// Two Executor headers on a begin, two Idempotency-Keys on a proposal, two
// Authorization headers, two Content-Types: each is 400
// ambiguous_header, and nothing reaches Kafka (the next good command on
// the same mandate, so the same partition, is the first decided).
func TestGatewayDuplicatedSingleValuedHeadersAre400AndProduceNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-dup", 3)
	addr := strings.TrimPrefix(b.base, "http://")
	auth := b.reserve(t, "m-dup", "dup-reserve")
	tok := b.tokens["acme"]
	body := string(proposeBody(100))
	send := func(method, path string, headers []string, body string) (*http.Response, map[string]any) {
		t.Helper()
		h := "Host: x\r\nConnection: close\r\n" + strings.Join(headers, "\r\n") + "\r\n"
		if body != "" {
			h += fmt.Sprintf("Content-Length: %d\r\n", len(body))
		}
		return raw(t, addr, method+" "+path+" HTTP/1.1\r\n"+h+"\r\n"+body)
	}
	bearer := "Authorization: Bearer " + tok
	for _, tc := range []struct {
		name, method, path string
		headers            []string
		body               string
	}{
		{"two Executor headers on a begin", "POST", auth + "/begin",
			[]string{bearer, "Executor: worker-a.1", "Executor: worker-b.1"}, ""},
		{"an Executor header twice, the second empty", "POST", auth + "/begin",
			[]string{bearer, "Executor: worker-a.1", "Executor:"}, ""},
		{"two Idempotency-Keys on a proposal", "POST", "/v1/orgs/acme/mandates/m-dup/proposals",
			[]string{bearer, "Content-Type: application/json", "Idempotency-Key: dup-1", "Idempotency-Key: dup-2"}, body},
		{"two Idempotency-Keys on a begin", "POST", auth + "/begin",
			[]string{bearer, "Executor: worker-c.1", "Idempotency-Key: k1", "Idempotency-Key: k2"}, ""},
		{"two Authorization headers", "POST", "/v1/orgs/acme/mandates/m-dup/proposals",
			[]string{bearer, "Authorization: Bearer " + b.tokens["globex"], "Content-Type: application/json", "Idempotency-Key: dup-3"}, body},
		{"two Authorization headers on a status read", "GET", auth,
			[]string{bearer, bearer}, ""},
		{"two Content-Types", "POST", "/v1/orgs/acme/mandates/m-dup/proposals",
			[]string{bearer, "Content-Type: application/json", "Content-Type: text/plain", "Idempotency-Key: dup-4"}, body},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, p := send(tc.method, tc.path, tc.headers, tc.body)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%v", p)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			require.Equal(t, string(gateway.ReasonAmbiguousHeader), p["reason"], "%v", p)
			require.Nil(t, p["decision"])
			require.Empty(t, resp.Header.Get("Request-Id"), "nothing was produced, so there is no request")
		})
	}

	// Prefer is a list (RFC 7240): two Prefer headers are one list, and
	// the first wait is the one taken (section 2: a preference given more
	// than once counts once, the first).
	resp, p := send("POST", "/v1/orgs/acme/mandates/m-dup/proposals",
		[]string{bearer, "Content-Type: application/json", "Idempotency-Key: dup-good", "Prefer: wait=20", "Prefer: wait=0"}, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", p)
	require.Equal(t, "wait=20", resp.Header.Get("Preference-Applied"))

	// The begin that is sent once, after all of it, is the first begin
	// decided: none of the refused ones reached Kafka.
	good := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "worker-z.1"}})
	require.Equal(t, http.StatusOK, good.status, "%s", good.body)
	require.Equal(t, "executing", good.json(t)["outcome"], "the first begin on the authorization: no refused begin was produced")
	for _, d := range b.h.Decisions.All() {
		if d.MandateID != "m-dup" || d.Source == nil {
			continue
		}
		require.Contains(t, []string{"dup-reserve", "dup-good", ""}, d.IdempotencyKey, "only the good commands were decided: %+v", d)
		if d.Command == string(wire.CmdBegin) {
			require.Equal(t, "worker-z.1", d.Authorization.Executor, "only the good begin was decided: %+v", d)
		}
	}
}

// Two traceparent headers are an invalid trace context (W3C Trace Context
// test suite, test_traceparent_duplicated): the gateway starts a new trace
// instead of joining either one. The request itself is served: tracing
// never decides what is produced.
func TestGatewayDuplicatedTraceparentStartsANewTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp, shutdown, err := tracing.NewProvider(context.Background(), tracing.Config{ServiceName: "test", Exporter: exp, Synchronous: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	addr := bare(t, gateway.Config{TracerProvider: tp})
	const one = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const two = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	resp, err := rawNoJSON(t, addr, "GET /v1/openapi.yaml HTTP/1.1\r\nHost: x\r\nConnection: close\r\ntraceparent: "+one+"\r\ntraceparent: "+two+"\r\n\r\n")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	spans := exp.GetSpans()
	require.NotEmpty(t, spans)
	for _, s := range spans {
		require.NotEqual(t, tracing.Parse(one).TraceID(), s.SpanContext.TraceID(), "joined the first traceparent")
		require.NotEqual(t, tracing.Parse(two).TraceID(), s.SpanContext.TraceID(), "joined the second traceparent")
		require.False(t, s.Parent.IsValid(), "a new trace has no remote parent")
	}
}

// rawNoJSON writes bytes on a new connection and reads the response,
// whatever its body.
func rawNoJSON(t *testing.T, addr, request string) (*http.Response, error) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, err
	}
	_, err = io.ReadAll(resp.Body)
	return resp, err
}
