package gateway_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway"
)

// The OpenAPI document and the router agree both ways: every operation of
// the document is a route (a real request reaches its handler: 401 without
// a token, 200 for the document itself, and the answer matches the
// document), every route is an operation, and a path's other methods are
// 405 with Allow naming exactly the documented ones.
func TestGatewayOpenAPIDocumentAndRoutesAgree(t *testing.T) {
	t.Parallel()
	srv, err := gateway.New(gateway.Config{}, nil, nil, nil)
	require.NoError(t, err)
	addr := bare(t, gateway.Config{})
	b := &testBundle{base: "http://" + addr, http: &http.Client{}, spec: openAPIValidator(t)}
	doc, err := libopenapi.NewDocument(gateway.OpenAPI)
	require.NoError(t, err)
	model, err := doc.BuildV3Model()
	require.NoError(t, err)

	example := strings.NewReplacer("{org}", "acme", "{mandate}", "m-1", "{authorization}", "au_1", "{key}", "k-1",
		"{request}", "rq-0-0-aaaaaaaaaaaaaaaaaaaaaaaaaa")
	documented := map[string]bool{}
	for path, item := range model.Model.Paths.PathItems.FromOldest() {
		var allow []string
		for method := range item.GetOperations().KeysFromOldest() {
			method = strings.ToUpper(method)
			documented[method+" "+path] = true
			allow = append(allow, method)
			if method == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
			r := b.do(t, req{method: method, path: example.Replace(path), invalid: true})
			if path == "/v1/openapi.yaml" {
				require.Equal(t, http.StatusOK, r.status)
				require.Equal(t, gateway.OpenAPI, r.body)
				continue
			}
			r.problem(t, http.StatusUnauthorized, gateway.ReasonUnauthenticated)
		}
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if slices.Contains(allow, method) {
				continue
			}
			r := b.do(t, req{method: method, path: example.Replace(path), unspecified: true})
			r.problem(t, http.StatusMethodNotAllowed, gateway.ReasonMethodNotAllowed)
			got := strings.Split(r.header.Get("Allow"), ", ")
			slices.Sort(got)
			slices.Sort(allow)
			require.Equal(t, allow, got, "%s %s", method, path)
		}
	}
	for _, route := range srv.Routes() {
		require.True(t, documented[route], "route %s is in the OpenAPI document", route)
	}
	require.Len(t, srv.Routes(), len(documented))
}
