package bench

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// sinkStatements reads the named SQL constants of package sink from its
// source, so that P2 replays the statements the code sends, verbatim, and
// fails loudly when one is renamed or changes its parameters.
func sinkStatements(repoRoot string) (map[string]string, error) {
	all, err := sqlConstants(filepath.Join(repoRoot, "sink"), "")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range batchStatementNames {
		s, ok := all[name]
		if !ok {
			return nil, fmt.Errorf("sink no longer declares %s: update test/bench (P2 replays the batch SQL)", name)
		}
		out[name] = s
	}
	return out, nil
}

// namedStatements returns every SQL constant of packages sink and outbox
// (the relay's prefixed "outbox."), to name the statements
// pg_stat_statements reports.
func namedStatements(repoRoot string) (map[string]string, error) {
	out, err := sqlConstants(filepath.Join(repoRoot, "sink"), "")
	if err != nil {
		return nil, err
	}
	relay, err := sqlConstants(filepath.Join(repoRoot, "outbox"), "outbox.")
	if err != nil {
		return nil, err
	}
	for k, v := range relay {
		out[k] = v
	}
	for k, v := range out {
		if !sqlVerb.MatchString(v) {
			delete(out, k)
		}
	}
	return out, nil
}

var sqlVerb = regexp.MustCompile(`^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\s`)

// sqlConstants evaluates the string constants declared in a package's
// non-test source files (concatenations of literals and other constants).
func sqlConstants(dir, prefix string) (map[string]string, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	exprs := map[string]ast.Expr{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						exprs[n.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	var eval func(e ast.Expr) (string, error)
	eval = func(e ast.Expr) (string, error) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", fmt.Errorf("not a string constant")
			}
			return strconv.Unquote(e.Value)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", fmt.Errorf("unsupported operator %s", e.Op)
			}
			l, err := eval(e.X)
			if err != nil {
				return "", err
			}
			r, err := eval(e.Y)
			return l + r, err
		case *ast.Ident:
			x, ok := exprs[e.Name]
			if !ok {
				return "", fmt.Errorf("unknown constant %s", e.Name)
			}
			return eval(x)
		case *ast.ParenExpr:
			return eval(e.X)
		}
		return "", fmt.Errorf("unsupported expression %T", e)
	}
	out := map[string]string{}
	for name, x := range exprs {
		if s, err := eval(x); err == nil {
			out[prefix+name] = s
		}
	}
	return out, nil
}

// batchStatementNames are the statements of one proposal batch, in the
// order sink.(*Sink).attempt sends them.
var batchStatementNames = []string{
	"lockPartitionSQL", "loadMandatesSQL", "loadIdemSQL", "loadAuthsSQL",
	"updateMandatesSQL", "insertAuthsSQL", "insertIdemSQL", "insertOutboxSQL", "advancePartitionSQL",
}

var placeholder = regexp.MustCompile(`\$(\d+)`)

// bind replaces $1..$n with literal SQL text; the parameter count must
// match the statement's exactly.
func bind(name, sql string, args []string) (string, error) {
	maxN := 0
	for _, m := range placeholder.FindAllStringSubmatch(sql, -1) {
		n, _ := strconv.Atoi(m[1])
		maxN = max(maxN, n)
	}
	if maxN != len(args) {
		return "", fmt.Errorf("sink.%s takes %d parameters, the P2 generator supplies %d: update test/bench/p2.go", name, maxN, len(args))
	}
	return placeholder.ReplaceAllStringFunc(sql, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return args[n-1]
	}), nil
}
