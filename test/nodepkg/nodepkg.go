// Package nodepkg builds, packs and installs the TypeScript package
// (clients/typescript, npm `@mandated/client`) for the Go tests that run its
// `node --test` suites against the real stack: the package's own suite
// (gateway/typescript_test.go) and the LangGraph.js example
// (examples/langgraphjs-approval).
//
// Everything is installed with `npm ci` from committed lockfiles, through
// npm's cache (~/.npm), into temporary directories: nothing is written into
// the repository. node and npm must be on PATH (Node ≥ 20.3): a test that
// needs them fails, never skips, when they are missing.
package nodepkg

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/testenv"
)

// Tools returns the paths of node and npm; the test fails when either is
// missing or node is older than 20.3.
func Tools(t testing.TB) (node, npm string) {
	t.Helper()
	testenv.SkipInShortTier(t, "installs the TypeScript package and its peers with npm and runs them under node")
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node (Node.js ≥ 20.3) is required by the TypeScript package's tests: install Node.js (test/infra/run-tests.sh checks for it)")
	npm, err = exec.LookPath("npm")
	require.NoError(t, err, "npm is required by the TypeScript package's tests: install Node.js with npm")
	out, err := exec.Command(node, "--version").Output()
	require.NoError(t, err)
	m := regexp.MustCompile(`^v(\d+)\.(\d+)`).FindStringSubmatch(strings.TrimSpace(string(out)))
	require.NotNil(t, m, "node --version: %q", out)
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	require.True(t, major > 20 || (major == 20 && minor >= 3), "Node.js ≥ 20.3 is required (AbortSignal.any), found %s", out)
	return node, npm
}

// Root is the repository's root, from a test's working directory (its package's folder).
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the test's directory")
		dir = parent
	}
}

// Pack copies clients/typescript to a temporary directory, installs its
// pinned toolchain (npm ci), compiles it with the TypeScript compiler and
// packs it as npm would publish it; it returns the tarball's path.
func Pack(ctx context.Context, t testing.TB) string {
	t.Helper()
	_, npm := Tools(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "client")
	require.NoError(t, CopyTree(filepath.Join(Root(t), "clients", "typescript"), src, skipBuilt))
	start := time.Now()
	Run(ctx, t, src, nil, npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline")
	t.Logf("npm ci clients/typescript: %s", time.Since(start).Round(time.Millisecond))
	Run(ctx, t, src, nil, npm, "run", "build")
	out := Run(ctx, t, src, nil, npm, "pack", "--ignore-scripts", "--pack-destination", dir)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	tarball := filepath.Join(dir, strings.TrimSpace(lines[len(lines)-1]))
	_, err := os.Stat(tarball)
	require.NoError(t, err, "npm pack printed:\n%s", out)
	return tarball
}

// Project copies the npm project at src (its package.json and
// package-lock.json, its sources and tests) to a temporary directory,
// installs its pinned dependencies (npm ci) and then the packed
// @mandated/client from tarball into its node_modules, as `npm install
// mandated-client-*.tgz` would (the package has no dependencies of its
// own). It returns the directory.
func Project(ctx context.Context, t testing.TB, src, tarball string) string {
	t.Helper()
	_, npm := Tools(t)
	dir := filepath.Join(t.TempDir(), filepath.Base(src))
	require.NoError(t, CopyTree(src, dir, skipBuilt))
	start := time.Now()
	Run(ctx, t, dir, nil, npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline")
	t.Logf("npm ci %s: %s", filepath.Base(src), time.Since(start).Round(time.Millisecond))
	require.NoError(t, Unpack(tarball, filepath.Join(dir, "node_modules", "@mandated", "client")))
	return dir
}

// Summary is what `node --test` counted.
type Summary struct {
	Tests, Pass, Fail, Cancelled, Skipped, Todo int
}

// Test runs `node --test` on paths in dir with env added and returns its
// output; the test fails unless every test passed and none was skipped,
// cancelled or left to do.
func Test(ctx context.Context, t testing.TB, dir string, env []string, paths ...string) string {
	t.Helper()
	node, _ := Tools(t)
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-reporter=tap"}, paths...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("node --test %s:\n%s", strings.Join(paths, " "), out)
	s := Parse(string(out))
	require.NoError(t, err, "node --test failed: %+v", s)
	require.Greater(t, s.Pass, 0, "node --test ran no test")
	require.Equal(t, Summary{Tests: s.Tests, Pass: s.Tests}, s, "every test passed and none was skipped, cancelled or todo")
	return string(out)
}

var countLine = regexp.MustCompile(`(?m)^# (tests|pass|fail|cancelled|skipped|todo) (\d+)$`)

// Parse reads the counts of a TAP report of `node --test`.
func Parse(out string) Summary {
	var s Summary
	for _, m := range countLine.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[2])
		switch m[1] {
		case "tests":
			s.Tests = n
		case "pass":
			s.Pass = n
		case "fail":
			s.Fail = n
		case "cancelled":
			s.Cancelled = n
		case "skipped":
			s.Skipped = n
		case "todo":
			s.Todo = n
		}
	}
	return s
}

// Run runs name with args in dir (env added) and returns its standard
// output; the test fails with both outputs when it fails.
func Run(ctx context.Context, t testing.TB, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"npm_config_update_notifier=false"}, env...)...)
	cmd.WaitDelay = 10 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %s in %s:\n%s%s", name, strings.Join(args, " "), dir, out, stderr.String())
	return string(out)
}

// skipBuilt leaves out what an install or a build makes.
func skipBuilt(rel string) bool {
	base := filepath.Base(rel)
	return base == "node_modules" || base == "dist" || strings.HasSuffix(base, ".tgz")
}

// CopyTree copies the files under from to to, leaving out what skip names
// (a path relative to from).
func CopyTree(from, to string, skip func(rel string) bool) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if rel != "." && skip != nil && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
}

// Unpack extracts an npm tarball (its files under package/) into dir.
func Unpack(tarball, dir string) error {
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		rel, ok := strings.CutPrefix(h.Name, "package/")
		if !ok || !filepath.IsLocal(rel) {
			return fmt.Errorf("unexpected entry %q in %s", h.Name, tarball)
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return err
		}
	}
}
