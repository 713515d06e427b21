// Package procs runs mandated's real binaries for tests: it builds them once
// per test process, starts instances with flags, waits on /readyz, and
// sends them the signals an operator (or a fault) would.
package procs

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mandated/mandated/test/testenv"
)

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]error{}
)

// Binary returns the path of a built command ("mandated", "mandatectl"),
// building it once per test process (with -race when the test binary has it).
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" {
		dir, err := os.MkdirTemp("", "mandated-bin-")
		if err != nil {
			t.Fatalf("procs: %v", err)
		}
		buildDir = dir
	}
	err, done := built[name]
	if !done {
		err = build(name)
		built[name] = err
	}
	if err != nil {
		t.Fatalf("procs: %v", err)
	}
	return filepath.Join(buildDir, name)
}

func build(name string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", filepath.Join(buildDir, name)}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/"+name)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	return nil
}

func moduleRoot() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", file)
		}
		dir = parent
	}
}

// FreePort returns a loopback TCP port that was free a moment ago and that
// no other caller in this test process was given (testenv.FreeRange: not
// the kernel's port 0, which hands the same port to processes started at
// once).
func FreePort(t testing.TB) int {
	t.Helper()
	return testenv.FreeRange(t, 1)
}

// Process is one running binary.
type Process struct {
	Name    string
	HTTP    string // host:port of its /metrics server, when it has one
	LogPath string

	t    testing.TB
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	mu   sync.Mutex
}

// Start runs a binary with args and env (added to a clean environment
// holding PATH and HOME only), logging to a file kept with the test.
func Start(t testing.TB, name, binary string, args []string, env []string) *Process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("procs: %v", err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("procs: start %s: %v", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, t: t, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Signal(syscall.SIGCONT)
		p.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("procs: last lines of %s:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// StartMandated runs cmd/mandated with an HTTP port of its own.
func StartMandated(t testing.TB, name string, args []string, env []string) *Process {
	t.Helper()
	port := FreePort(t)
	args = append([]string{"--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-format", "json", "--owner", name}, args...)
	p := Start(t, name, Binary(t, "mandated"), args, env)
	p.HTTP = fmt.Sprintf("127.0.0.1:%d", port)
	return p
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// Stopped reports whether the process is stopped (SIGSTOP, state T in
// /proc/<pid>/stat; Linux only).
func (p *Process) Stopped() bool {
	if p.Exited() {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, so read after its ')'.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// Kill sends SIGKILL and waits for the process to be reaped.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitCode returns the exit code of a process that has exited (-1 if a
// signal ended it, or if it is still running).
func (p *Process) ExitCode() int {
	if !p.Exited() || p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Wait waits up to timeout for the process to exit and returns its exit code
// (-1 if it was killed by a signal).
func (p *Process) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s still running after %s", p.Name, timeout)
	}
	if p.cmd.ProcessState == nil {
		return 0, p.err
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// Get fetches a path from the process's HTTP server.
func (p *Process) Get(path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HTTP+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), nil
}

// WaitReady polls /readyz until it answers 200.
func (p *Process) WaitReady(timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			p.t.Fatalf("procs: %s exited before it was ready", p.Name)
		}
		if code, _, err := p.Get("/readyz"); err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			_, body, err := p.Get("/readyz")
			p.t.Fatalf("procs: %s not ready after %s: %s %v", p.Name, timeout, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Log returns the process's output so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}
