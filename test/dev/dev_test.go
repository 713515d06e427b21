// Package dev tests `make dev` (test/infra/dev.sh) as a newcomer uses it: the
// stack starts, the README's first curl and Python blocks run as written
// against it, and Ctrl-C stops everything it started.
package dev

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/testenv"
)

func TestMain(m *testing.M) {
	testenv.SkipPackageInShortTier("make dev started for real, with the README's examples in a fresh virtual environment")
	goleak.VerifyTestMain(m)
}

const repo = "../.."

// TestMakeDevRunsTheREADMEsFirstExamplesAndStopsOnCtrlC starts test/infra/dev.sh
// on the test servers (a database and topics of its own, free ports), runs the
// README's curl block and its Python block (the same bytes as
// examples/quickstart.py) with the env file make dev wrote, and then
// interrupts make dev as Ctrl-C would: mandated and the gateway are gone and
// the state directory is removed.
func TestMakeDevRunsTheREADMEsFirstExamplesAndStopsOnCtrlC(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	require.NoError(t, err, "python3 is required (test/infra/run-tests.sh installs it)")
	readme := readFile(t, filepath.Join(repo, "README.md"))
	curlBlock := firstBlock(t, readme, "sh", "curl ")
	pyBlock := firstBlock(t, readme, "python", "")
	require.Equal(t, readFile(t, filepath.Join(repo, "examples", "quickstart.py")), pyBlock,
		"the README's Python block is examples/quickstart.py, byte for byte")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	brokers := testenv.KafkaBrokers(t)
	prefix := testenv.Name(t, "dev") + "."
	t.Cleanup(func() { deleteTopics(t, brokers, prefix) })
	base := testenv.FreeRange(t, 3)
	gateway := fmt.Sprintf("127.0.0.1:%d", base)
	dir := filepath.Join(t.TempDir(), "dev")

	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repo, "test", "infra", "dev.sh"))
	cmd.Env = append(os.Environ(), "DEV_DIR="+dir, "DEV_BROKERS="+strings.Join(brokers, ","),
		"DEV_DATABASE_URL="+testenv.Database(t), "DEV_TOPIC_PREFIX="+prefix,
		"DEV_GATEWAY_ADDR="+gateway, fmt.Sprintf("DEV_GATEWAY_OPS_ADDR=127.0.0.1:%d", base+1),
		fmt.Sprintf("DEV_MANDATED_ADDR=127.0.0.1:%d", base+2))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	stopped := make(chan struct{}) // closed once make dev has exited
	printed := make(chan string, 1)
	go func() {
		var all strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "the console:") {
				printed <- all.String()
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
		close(stopped)
	}()
	// A failing test still stops the stack, and waits for dev.sh to have done
	// so before t.TempDir's cleanup deletes the PID files it stops by (this
	// cleanup runs first: cleanups run last-registered first).
	t.Cleanup(func() {
		select {
		case <-stopped:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-stopped:
		case <-time.After(2 * time.Minute):
			t.Errorf("make dev did not stop within 2 minutes of SIGTERM")
		}
	})
	var banner string
	select {
	case banner = <-printed:
	case err := <-exited:
		t.Fatalf("make dev exited before it was ready (%v):\n%s", err, stderr.String())
	case <-ctx.Done():
		t.Fatalf("make dev was not ready in time:\n%s", stderr.String())
	}
	t.Logf("make dev printed:\n%s", banner)
	require.Contains(t, banner, "source "+filepath.Join(dir, "env"), "the first thing to type")
	require.Contains(t, banner, "python3 examples/quickstart.py", "the second")
	require.Contains(t, banner, "http://"+gateway+"/console", "the third")
	pids := map[string]int{}
	for _, name := range []string{"mandated", "mandate-gateway"} {
		pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, name+".pid"))))
		require.NoError(t, err)
		require.NoError(t, syscall.Kill(pid, 0), "%s runs", name)
		pids[name] = pid
	}

	// The README's blocks, as written, but for the gateway's address (make dev's
	// documented 127.0.0.1:8090 is another test's to take here).
	env := filepath.Join(dir, "env")
	curl := strings.ReplaceAll(curlBlock, "http://localhost:8090", "http://"+gateway)
	out := run(ctx, t, "bash", "-c", "set -e; source "+env+"\n"+curl)
	require.Contains(t, out, `"outcome":"reserved"`, "the curl reserves the sample mandate's one use")

	// mandatectl, which the banner, the console and a 401 tell the newcomer to
	// run, is on PATH once the env file is sourced.
	out = run(ctx, t, "bash", "-c", "source "+env+"\nmandatectl inspect acme/refund-case-1842")
	require.Contains(t, out, "refund-case-1842", "mandatectl inspect ORG/MANDATE after sourcing the env file")

	venv := installPackage(ctx, t, py)
	out = run(ctx, t, "bash", "-c", "source "+env+"\nexec "+venv+" "+filepath.Join(repo, "examples", "quickstart.py"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, "the Python block prints the outcome, then the execution:\n%s", out)
	require.Equal(t, "replayed", lines[0], "the same intent as the curl's is a replay of its reservation")
	require.Regexp(t, `^re_\S+ \{'status': 'succeeded'\}$`, lines[1])
	// Run again (a second worker resuming the approval): the same recorded
	// result, and the refund is not run again.
	again := run(ctx, t, "bash", "-c", "source "+env+"\nexec "+venv+" "+filepath.Join(repo, "examples", "quickstart.py"))
	require.Equal(t, out, again, "a second run of the block gets the winner's recorded result")

	// The LangGraph snippet, as the program examples/langgraph_quickstart.py
	// (refund-case-1843; its checkpointer on make dev's PostgreSQL): the first
	// run pauses and is resumed once, the second finds the thread as recorded.
	lgRun := func() string {
		out := run(ctx, t, "bash", "-c", "source "+env+"\nexec "+venv+" "+filepath.Join(repo, "examples", "langgraph_quickstart.py"))
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return lines[len(lines)-1]
	}
	lgFirst := lgRun()
	require.Regexp(t, `^refunded \{.*'order_id': 'order-1843'`, lgFirst)
	require.Equal(t, lgFirst, lgRun(), "the restored thread prints the same recorded refund")

	// The Go snippet is examples/go-quickstart's, run with go run as the
	// README says: the same intent, so a replay with the recorded effect.
	require.Equal(t, goSnippet(t), firstBlock(t, readme, "go", ""), "the README's Go block is examples/go-quickstart's, between its markers")
	out = run(ctx, t, "bash", "-c", "source "+env+"\ncd "+repo+" && go run ./examples/go-quickstart")
	require.Equal(t, "replayed\n"+strings.Replace(lines[1], "{'status': 'succeeded'}", `{"status":"succeeded"}`, 1)+"\n", out,
		"Go gets the recorded effect the Python block made")

	// The TypeScript snippet: its two commands as the README gives them, in a
	// copy of the package and the example (npm writes node_modules where it runs).
	tsDir := t.TempDir()
	require.NoError(t, copyTree(filepath.Join(repo, "clients", "typescript"), filepath.Join(tsDir, "clients", "typescript")))
	require.NoError(t, os.MkdirAll(filepath.Join(tsDir, "examples"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tsDir, "examples", "quickstart.mjs"), []byte(readFile(t, filepath.Join(repo, "examples", "quickstart.mjs"))), 0o644))
	tsRun := "source " + env + "\ncd " + tsDir + "\nset -e\n" + firstBlock(t, readme, "sh", "npm ci")
	out = run(ctx, t, "bash", "-c", tsRun)
	require.Regexp(t, `(?m)^reserved\nre_\S{12} \{"status":"succeeded"\}\n$`, out, "the TypeScript block spends refund-case-1844")
	again = run(ctx, t, "bash", "-c", "source "+env+"\ncd "+tsDir+"\nnode examples/quickstart.mjs")
	require.True(t, strings.HasSuffix(out, again), "a second run prints the same recorded result:\n%s\nthen\n%s", out, again)

	// Ctrl-C.
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-exited:
		require.NoError(t, err, "a stop that was asked for is not an error (make would say Error 130):\n%s", stderr.String())
	case <-ctx.Done():
		t.Fatal("make dev did not stop after Ctrl-C")
	}
	for name, pid := range pids {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "%s (pid %d) stopped with make dev", name, pid)
	}
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "make dev removed its state directory")
}

// goSnippet is examples/go-quickstart's code between its README markers,
// one tab of indentation less and each further tab written as four spaces.
func goSnippet(t *testing.T) string {
	t.Helper()
	src := readFile(t, filepath.Join(repo, "examples", "go-quickstart", "main.go"))
	_, body, ok := strings.Cut(src, "\t// README begin\n")
	require.True(t, ok, "examples/go-quickstart has its README markers")
	body, _, ok = strings.Cut(body, "\t// README end\n")
	require.True(t, ok)
	var b strings.Builder
	for _, line := range strings.SplitAfter(body, "\n") {
		line = strings.TrimPrefix(line, "\t")
		tabs := len(line) - len(strings.TrimLeft(line, "\t"))
		b.WriteString(strings.Repeat("    ", tabs) + line[tabs:])
	}
	return b.String()
}

// copyTree copies the files under from to to, leaving out what a build or an
// install made there (node_modules, dist).
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "dist") {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
}

// firstBlock is the body of the README's first fenced block of lang that
// contains must.
func firstBlock(t *testing.T, doc, lang, must string) string {
	t.Helper()
	re := regexp.MustCompile("(?ms)^```" + lang + "\n(.*?)^```\n")
	for _, m := range re.FindAllStringSubmatch(doc, -1) {
		if strings.Contains(m[1], must) {
			return m[1]
		}
	}
	t.Fatalf("README.md has no ```%s block containing %q", lang, must)
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

func run(ctx context.Context, t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %v:\n%s%s", name, args, out, stderr.String())
	return string(out)
}

// installPackage pip-installs a copy of clients/python with its [langgraph]
// extra into a virtual environment, as `pip install "./clients/python[langgraph]"`
// would, and returns its python.
func installPackage(ctx context.Context, t *testing.T, py string) string {
	t.Helper()
	dir := t.TempDir()
	run(ctx, t, "cp", "-r", filepath.Join(repo, "clients", "python"), filepath.Join(dir, "src"))
	run(ctx, t, py, "-m", "venv", filepath.Join(dir, "venv"))
	venv := filepath.Join(dir, "venv", "bin", "python")
	// As the README says for the LangGraph snippet: the package with its
	// [langgraph] extra (the plain package is part of it).
	run(ctx, t, venv, "-m", "pip", "install", "--quiet", filepath.Join(dir, "src")+"[langgraph]")
	return venv
}

func deleteTopics(t *testing.T, brokers []string, prefix string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := []string{"mandate.proposals", "mandate.grants", "mandate.decisions", "mandate.deadletter"}
	for i := range names {
		names[i] = prefix + names[i]
	}
	if _, err := adm.DeleteTopics(ctx, names...); err != nil {
		t.Logf("could not delete the dev topics: %v", err)
	}
}
