package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ChildConfigEnv carries a child's JSON configuration.
const ChildConfigEnv = "BENCH_CHILD_CONFIG"

// child is a process of this same executable in another mode ("serve",
// "pipe"), so that its CPU can be read from /proc on its own.
type child struct {
	name string
	cmd  *exec.Cmd
	addr string // "serve" only
	done chan error
}

func startChild(workDir, name, mode string, cfg any) (*child, error) {
	return startChildOf("", workDir, name, mode, cfg)
}

// startChildOf starts the child from exe (empty: this executable), e.g. a
// benchrun built from another commit (Config.ExpBinary).
func startChildOf(exe, workDir, name, mode string, cfg any) (*child, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(workDir, name+".stderr.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, mode)
	cmd.Env = append(os.Environ(), ChildConfigEnv+"="+string(js))
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			if first {
				lines <- sc.Text()
				first = false
			}
		}
	}()
	go func() { c.done <- cmd.Wait(); logf.Close() }()
	select {
	case line := <-lines:
		if addr, ok := strings.CutPrefix(line, "LISTEN "); ok {
			c.addr = addr
		}
		return c, nil
	case err := <-c.done:
		return nil, fmt.Errorf("%s exited during start: %v (see %s)", name, err, logf.Name())
	case <-time.After(2 * time.Minute):
		c.kill()
		return nil, fmt.Errorf("%s did not start in 2 minutes (see %s)", name, logf.Name())
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop sends SIGTERM and waits (SIGKILL after 30 s).
func (c *child) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		return err
	case <-time.After(30 * time.Second):
		c.kill()
		return fmt.Errorf("%s ignored SIGTERM for 30s; killed", c.name)
	}
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

var httpc = &http.Client{Timeout: 2 * time.Minute}

func (c *child) getJSON(path string, v any) error {
	resp, err := httpc.Get("http://" + c.addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func (c *child) stats() ServeStats {
	var s ServeStats
	if err := c.getJSON("/stats", &s); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s /stats: %v\n", c.name, err)
	}
	return s
}

func (c *child) fetch(path, file string) error {
	resp, err := httpc.Get("http://" + c.addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.ReadFrom(resp.Body)
	return err
}

// waitOwned polls /stats until the child owns n partitions.
func (c *child) waitOwned(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c.stats().Owned >= n {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s owns fewer than %d partitions after %s", c.name, n, timeout)
}
