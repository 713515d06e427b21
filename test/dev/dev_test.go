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

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// installPackage pip-installs a copy of clients/python into a virtual
// environment, as `pip install ./clients/python` would, and returns its python.
func installPackage(ctx context.Context, t *testing.T, py string) string {
	t.Helper()
	dir := t.TempDir()
	run(ctx, t, "cp", "-r", filepath.Join(repo, "clients", "python"), filepath.Join(dir, "src"))
	run(ctx, t, py, "-m", "venv", filepath.Join(dir, "venv"))
	venv := filepath.Join(dir, "venv", "bin", "python")
	run(ctx, t, venv, "-m", "pip", "install", "--quiet", filepath.Join(dir, "src"))
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
