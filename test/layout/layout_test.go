package layout

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const module = "github.com/mandated/mandated"

// TestTheHouseKeepsItsShape: every package of the module is on a floor, no
// production import runs up the house, and every floor of the plan still
// holds a package (the plan describes the tree, not a past one).
func TestTheHouseKeepsItsShape(t *testing.T) {
	t.Parallel()
	mod, pkgs, err := List(filepath.Join("..", ".."))
	require.NoError(t, err)
	require.Equal(t, module, mod)

	var msgs []string
	for _, v := range Check(Plan, mod, pkgs) {
		msgs = append(msgs, v.Msg)
	}
	require.Empty(t, msgs, "imports that break the layout plan")

	for _, f := range Plan {
		for _, p := range f.Packages {
			held := false
			for _, pkg := range pkgs {
				if got, ok := floorOf([]Floor{{Packages: []string{p}}}, rel(pkg.ImportPath)); ok && got.Packages[0] == p {
					held = true
					break
				}
			}
			require.True(t, held, "floor %s names %s, which holds no package", f.Name, p)
		}
	}
}

func rel(path string) string {
	if path == module {
		return ""
	}
	return path[len(module)+1:]
}

// TestTheFloorPlanHasNoUpwardArrow: each floor imports only floors below it
// in the plan, so the plan itself can hold no cycle; a plan with an arrow
// pointing up, or at no floor, is refused.
func TestTheFloorPlanHasNoUpwardArrow(t *testing.T) {
	t.Parallel()
	require.NoError(t, CheckPlan(Plan))

	bad := []Floor{
		{Name: "wire", Packages: []string{"wire"}, Imports: []string{"sink"}},
		{Name: "sink", Packages: []string{"sink", "wire"}, Imports: []string{"wire", "attic"}},
	}
	err := CheckPlan(bad)
	require.ErrorContains(t, err, "floor wire imports sink, which is not a floor below it")
	require.ErrorContains(t, err, "floor sink imports attic, which is not a floor below it")
	require.ErrorContains(t, err, "wire is on floors wire and sink")
}

// TestAnUpwardImportFailsNamingIt plants upward imports in a copy of a
// sound graph (a caller's client reaching into storage, the contract
// importing a test seam, storage importing its auditor, the runtime sink
// importing the operator layer, the processor importing the test harness),
// the shard map importing the PostgreSQL driver, and a package on no
// floor: each is reported, naming the package, the import and the floors,
// and nothing else is.
func TestAnUpwardImportFailsNamingIt(t *testing.T) {
	t.Parallel()
	m := func(rel string) string { return module + "/" + rel }
	sound := []Package{
		{ImportPath: m("partitioner")},
		{ImportPath: m("wire"), Imports: []string{"bytes", m("partitioner")}},
		{ImportPath: m("lifecycle"), Imports: []string{m("partitioner"), m("wire")}},
		{ImportPath: m("internal/clock")},
		{ImportPath: m("internal/failpoint")},
		{ImportPath: m("outbox/outboxrow"), Imports: []string{m("wire")}},
		{ImportPath: m("outbox"), Imports: []string{m("internal/failpoint"), m("wire"), m("outbox/outboxrow")}},
		{ImportPath: m("sink/pgerr"), Imports: []string{m("internal/failpoint"), "github.com/jackc/pgx/v5"}},
		{ImportPath: m("sink/shardmap"), Imports: []string{m("internal/failpoint"), "go.yaml.in/yaml/v3"}},
		{ImportPath: m("sink"), Imports: []string{m("outbox/outboxrow"), m("lifecycle"), m("wire"), m("sink/pgerr"), m("sink/shardmap"), "github.com/jackc/pgx/v5"}},
		{ImportPath: m("verify"), Imports: []string{m("outbox"), m("sink"), m("wire")}},
		{ImportPath: m("processor"), Imports: []string{m("internal/clock"), m("outbox"), m("sink"), m("lifecycle")}},
		{ImportPath: m("admin"), Imports: []string{m("sink"), m("sink/pgerr"), m("sink/shardmap"), m("outbox"), "github.com/jackc/pgx/v5"}},
		{ImportPath: m("client"), Imports: []string{m("partitioner"), m("wire")}},
		{ImportPath: m("gateway"), Imports: []string{m("client"), m("wire")}},
		{ImportPath: m("cmd/internal/cli")},
		{ImportPath: m("cmd/mandatectl"), Imports: []string{m("cmd/internal/cli"), m("verify"), m("processor"), m("admin"), m("gateway")}},
		{ImportPath: m("test/testenv")},
		{ImportPath: m("test/harness"), Imports: []string{m("test/testenv"), m("processor")}},
	}
	require.Empty(t, Check(Plan, module, sound), "the sound graph passes")

	planted := map[string][]string{
		"client":        {m("sink")},
		"wire":          {m("internal/failpoint")},
		"sink":          {m("verify"), m("admin"), m("outbox")},
		"sink/shardmap": {"github.com/jackc/pgx/v5"},
		"processor":     {m("test/testenv")},
	}
	var graph []Package
	for _, p := range sound {
		p.Imports = append(append([]string(nil), p.Imports...), planted[rel(p.ImportPath)]...)
		graph = append(graph, p)
	}
	graph = append(graph, Package{ImportPath: m("attic"), Imports: []string{m("wire")}})

	var got []string
	for _, v := range Check(Plan, module, graph) {
		got = append(got, v.Msg)
	}
	require.Equal(t, []string{
		module + "/attic is on no floor of the layout plan (test/layout/layout.go): give it one",
		module + "/client imports " + module + "/sink: floor client (the Go client callers import: the contract alone, nothing that decides or stores) may import only its own floor and partitioner, wire, not floor sink (PostgreSQL at run time: the fenced batch transaction writes outbox rows (outboxrow), never the relay)",
		module + "/processor imports " + module + "/test/testenv: floor processor (the consumer-group member that wires the floors below) may import only its own floor and partitioner, wire, lifecycle, internal, outboxrow, outbox, pgerr, shardmap, sink, verify, not floor test (test servers, harnesses and suites: nothing else may import them)",
		module + "/sink imports " + module + "/admin: floor sink (PostgreSQL at run time: the fenced batch transaction writes outbox rows (outboxrow), never the relay) may import only its own floor and partitioner, wire, lifecycle, internal, outboxrow, pgerr, shardmap, not floor admin (the operator layer (kadm to the runtime's kgo): moves, repartition, org settings, grantor-key writes, verify-run records)",
		module + "/sink imports " + module + "/outbox: floor sink (PostgreSQL at run time: the fenced batch transaction writes outbox rows (outboxrow), never the relay) may import only its own floor and partitioner, wire, lifecycle, internal, outboxrow, pgerr, shardmap, not floor outbox (the relay: publishes outbox rows, reads the tail back)",
		module + "/sink imports " + module + "/verify: floor sink (PostgreSQL at run time: the fenced batch transaction writes outbox rows (outboxrow), never the relay) may import only its own floor and partitioner, wire, lifecycle, internal, outboxrow, pgerr, shardmap, not floor verify (the auditor: reads the published history and PostgreSQL, never imported by them)",
		module + "/sink/shardmap imports github.com/jackc/pgx/v5: floor shardmap (the shard map: its file, its edits and their lock, never the driver) must never import github.com/jackc/",
		module + "/wire imports " + module + "/internal/failpoint: floor wire (the contract: decoder, encoder, reasons, schemas, chain form, intent keys) may import only its own floor and partitioner, not floor internal (the test seams (clock, failpoint) and the tracing plumbing: they import nothing of ours)",
	}, got)
}

// TestTheEdgeLinksOnlyTheEdge: mandate-gateway and mandate-mcp link neither
// the processor, the relay nor the operator layer (issue 44 item 2); a
// planted dependency is reported naming the binary and the package.
func TestTheEdgeLinksOnlyTheEdge(t *testing.T) {
	t.Parallel()
	for binary, never := range Edge {
		linked, err := Linked(filepath.Join("..", ".."), module, binary)
		require.NoError(t, err)
		require.Contains(t, linked, "wire", "%s: go list -deps lists the module's packages", binary)
		require.Empty(t, CheckEdge(binary, linked, never))
	}

	got := CheckEdge("cmd/mandate-gateway", []string{"wire", "outbox/outboxrow", "sink", "outbox", "admin"}, Edge["cmd/mandate-gateway"])
	require.Equal(t, []string{
		"cmd/mandate-gateway links outbox: a binary at the edge must never link processor, outbox, admin",
		"cmd/mandate-gateway links admin: a binary at the edge must never link processor, outbox, admin",
	}, got)
}
