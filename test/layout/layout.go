// Package layout is the floor plan of mandated's packages: which may import
// which. The contract (wire) and the decision logic (lifecycle) are the
// ground floor everything else stands on; storage (the outbox row, the
// relay, sink, with the shard map and the SQLSTATE translation beneath sink)
// stands on them, the
// auditor (verify) on storage, the processor on all of those, the operator
// layer (admin) on the processor and storage — the runtime never imports
// it; the client stands beside them on the contract alone, the gateway on
// the client and storage, the binaries (cmd) on everything. TestTheHouseKeepsItsShape
// runs Check over 'go list -deps -json ./...' of the module, so an import that
// runs back up the house, or a package given no floor, fails the suite and
// names the import.
//
// Only production imports are checked: a package's tests may reach up (they
// stand on test/harness, which stands on everything).
//
// Package layout must never import anything of ours: it reads the import
// graph from the go command, not from the packages themselves.
package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
)

// Floor is one floor of the house: its packages and the floors below it
// that they may import. A package may always import the other packages of
// its own floor.
type Floor struct {
	Name string
	// Packages are import paths relative to the module root; "x/..." is x
	// and every package under it.
	Packages []string
	// Imports names the floors (earlier in the plan) this floor may import.
	Imports []string
	// Owns says what the floor is for, for the failure message.
	Owns string
	// Never names imports from outside the module (path prefixes) the
	// floor must not take, such as the PostgreSQL driver for the shard map.
	Never []string
}

// Plan is mandated's floor plan, bottom first. A floor may import only
// floors listed before it, so the plan itself has no cycle and no upward
// arrow (CheckPlan).
var Plan = []Floor{
	{Name: "partitioner", Packages: []string{"partitioner"},
		Owns: "the mandate key and Kafka's partition function"},
	{Name: "wire", Packages: []string{"wire"}, Imports: []string{"partitioner"},
		Owns: "the contract: decoder, encoder, reasons, schemas, chain form, intent keys"},
	{Name: "lifecycle", Packages: []string{"lifecycle"}, Imports: []string{"partitioner", "wire"},
		Owns: "the pure state machine"},
	{Name: "internal", Packages: []string{"internal/..."},
		Owns: "the test seams (clock, failpoint) and the tracing plumbing: they import nothing of ours"},
	{Name: "pgerr", Packages: []string{"sink/pgerr"}, Imports: []string{"internal"},
		Owns: "the one translation of PostgreSQL's errors (SQLSTATEs) that sink and admin share"},
	{Name: "shardmap", Packages: []string{"sink/shardmap"}, Imports: []string{"internal"},
		Owns: "the shard map: its file, its edits and their lock, never the driver", Never: []string{"github.com/jackc/"}},
	{Name: "outboxrow", Packages: []string{"outbox/outboxrow"}, Imports: []string{"partitioner", "wire"},
		Owns: "the outbox row, its Kafka record and its hash chain: what the sink writes and the relay publishes"},
	{Name: "outbox", Packages: []string{"outbox"}, Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow"},
		Owns: "the relay: publishes outbox rows, reads the tail back"},
	{Name: "sink", Packages: []string{"sink"}, Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "pgerr", "shardmap"},
		Owns: "PostgreSQL at run time: the fenced batch transaction writes outbox rows (outboxrow), never the relay"},
	{Name: "verify", Packages: []string{"verify"}, Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "outbox", "pgerr", "shardmap", "sink"},
		Owns: "the auditor: reads the published history and PostgreSQL, never imported by them"},
	{Name: "processor", Packages: []string{"processor"},
		Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "outbox", "pgerr", "shardmap", "sink", "verify"},
		Owns:    "the consumer-group member that wires the floors below"},
	{Name: "admin", Packages: []string{"admin"},
		Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "outbox", "pgerr", "shardmap", "sink"},
		Owns:    "the operator layer (kadm to the runtime's kgo): moves, repartition, org settings, grantor-key writes, verify-run records"},
	{Name: "client", Packages: []string{"client"}, Imports: []string{"partitioner", "wire"},
		Owns: "the Go client callers import: the contract alone, nothing that decides or stores"},
	{Name: "mcpguard", Packages: []string{"mcpguard"}, Imports: []string{"partitioner", "wire", "internal", "client"},
		Owns: "the MCP door: guards an upstream MCP server's tool calls, produces through client, never decides"},
	{Name: "gateway", Packages: []string{"gateway"}, Imports: []string{"partitioner", "wire", "internal", "client", "shardmap", "sink"},
		Owns: "the HTTP door: produces through client, only reads PostgreSQL, never decides"},
	{Name: "console", Packages: []string{"gateway/console"}, Imports: []string{"partitioner", "wire", "lifecycle", "internal", "client", "sink", "gateway"},
		Owns: "the operators' web console of the gateway: reads PostgreSQL through sink's operator reads (lifecycle's row types, the decision history, the verify runs), produces resolves through client"},
	{Name: "cmd", Packages: []string{"cmd/..."},
		Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "outbox", "pgerr", "shardmap", "sink", "verify", "processor", "admin", "client", "gateway", "console", "mcpguard"},
		Owns:    "the binaries: wiring and configuration"},
	{Name: "test", Packages: []string{"test/..."},
		Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "outbox", "pgerr", "shardmap", "sink", "verify", "processor", "admin", "client", "gateway", "console", "mcpguard", "cmd"},
		Owns:    "test servers, harnesses and suites: nothing else may import them"},
	{Name: "examples", Packages: []string{"examples/..."},
		Imports: []string{"partitioner", "wire", "lifecycle", "internal", "outboxrow", "outbox", "pgerr", "shardmap", "sink", "verify", "processor", "admin", "client", "gateway", "console", "mcpguard", "cmd", "test"},
		Owns:    "runnable examples of mandated where agents act (LangGraph) and the Go tests that run them against the real stack"},
}

// Package is one package of the import graph, as 'go list' reports it.
type Package struct {
	ImportPath string
	Imports    []string
}

// Violation is one import the plan does not allow, or a package on no floor.
type Violation struct {
	Package, Import string // Import is empty for a package on no floor
	Msg             string
}

func (v Violation) String() string { return v.Msg }

// CheckPlan reports what is wrong with a plan itself: a floor importing a
// floor not below it (an upward arrow or a cycle), an unknown floor, a
// package pattern on two floors.
func CheckPlan(plan []Floor) error {
	var errs []error
	below := map[string]bool{}
	owner := map[string]string{}
	for _, f := range plan {
		for _, imp := range f.Imports {
			if !below[imp] {
				errs = append(errs, fmt.Errorf("floor %s imports %s, which is not a floor below it", f.Name, imp))
			}
		}
		for _, p := range f.Packages {
			if o, ok := owner[p]; ok {
				errs = append(errs, fmt.Errorf("%s is on floors %s and %s", p, o, f.Name))
			}
			owner[p] = f.Name
		}
		below[f.Name] = true
	}
	return errors.Join(errs...)
}

// floorOf returns the floor holding rel (an import path relative to the
// module), the most specific pattern winning.
func floorOf(plan []Floor, rel string) (Floor, bool) {
	var best Floor
	bestLen := -1
	for _, f := range plan {
		for _, p := range f.Packages {
			n := len(p)
			if base, ok := strings.CutSuffix(p, "/..."); ok {
				if rel != base && !strings.HasPrefix(rel, base+"/") {
					continue
				}
				n = len(base)
			} else if rel != p {
				continue
			}
			if n > bestLen {
				best, bestLen = f, n
			}
		}
	}
	return best, bestLen >= 0
}

// Check returns every import among the module's packages that the plan does
// not allow, and every package of the module on no floor, sorted.
func Check(plan []Floor, module string, pkgs []Package) []Violation {
	var out []Violation
	rel := func(path string) (string, bool) {
		if path == module {
			return "", true
		}
		return strings.CutPrefix(path, module+"/")
	}
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		ff, ok := floorOf(plan, from)
		if !ok {
			out = append(out, Violation{Package: p.ImportPath,
				Msg: fmt.Sprintf("%s is on no floor of the layout plan (test/layout/layout.go): give it one", p.ImportPath)})
			continue
		}
		for _, imp := range p.Imports {
			to, ok := rel(imp)
			if !ok {
				for _, never := range ff.Never {
					if strings.HasPrefix(imp, never) {
						out = append(out, Violation{Package: p.ImportPath, Import: imp,
							Msg: fmt.Sprintf("%s imports %s: floor %s (%s) must never import %s", p.ImportPath, imp, ff.Name, ff.Owns, never)})
					}
				}
				continue
			}
			tf, ok := floorOf(plan, to)
			if ok && (tf.Name == ff.Name || slices.Contains(ff.Imports, tf.Name)) {
				continue
			}
			msg := fmt.Sprintf("%s imports %s: floor %s (%s) may import only %s", p.ImportPath, imp, ff.Name, ff.Owns, allowed(ff))
			if ok {
				msg += fmt.Sprintf(", not floor %s (%s)", tf.Name, tf.Owns)
			} else {
				msg += fmt.Sprintf(", and %s is on no floor", imp)
			}
			out = append(out, Violation{Package: p.ImportPath, Import: imp, Msg: msg})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Msg < out[j].Msg })
	return out
}

func allowed(f Floor) string {
	if len(f.Imports) == 0 {
		return "its own floor (nothing of ours below it)"
	}
	return "its own floor and " + strings.Join(f.Imports, ", ")
}

// List runs 'go list -deps -json ./...' in dir (a module root) and returns
// the main module's path and its packages with their production imports.
func List(dir string) (module string, pkgs []Package, err error) {
	cmd := exec.Command("go", "list", "-deps", "-json", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Module     *struct {
				Path string
				Main bool
			}
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", nil, fmt.Errorf("go list output: %w", err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		module = p.Module.Path
		pkgs = append(pkgs, Package{ImportPath: p.ImportPath, Imports: p.Imports})
	}
	if module == "" {
		return "", nil, errors.New("go list: no package of the main module")
	}
	return module, pkgs, nil
}

// Edge is what a binary at the edge (the HTTP gateway, the MCP guard) must
// never link: the runtime that decides and publishes (processor, the relay
// in outbox) and the operator layer (admin). A caller's door links the
// contract, the client and sink's reads, nothing that can decide.
var Edge = map[string][]string{
	"cmd/mandate-gateway": {"processor", "outbox", "admin"},
	"cmd/mandate-mcp":     {"processor", "outbox", "admin"},
}

// Linked returns the module's packages (relative paths) that the package
// rel links, directly or not: 'go list -deps' in dir.
func Linked(dir, module, rel string) ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./"+rel)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps ./%s: %w: %s", rel, err, stderr.String())
	}
	var deps []string
	for _, line := range strings.Fields(string(out)) {
		if r, ok := strings.CutPrefix(line, module+"/"); ok {
			deps = append(deps, r)
		}
	}
	return deps, nil
}

// CheckEdge returns one message per package a binary links and must not
// (exact package paths: outbox/outboxrow is not outbox).
func CheckEdge(binary string, linked, never []string) []string {
	var msgs []string
	for _, p := range linked {
		if slices.Contains(never, p) {
			msgs = append(msgs, fmt.Sprintf("%s links %s: a binary at the edge must never link %s", binary, p, strings.Join(never, ", ")))
		}
	}
	return msgs
}
