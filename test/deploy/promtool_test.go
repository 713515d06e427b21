package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	promtoolOnce sync.Once
	promtoolPath string
	promtoolWhy  string
)

// promtool finds promtool or installs it (Debian's prometheus package
// ships /usr/bin/promtool). Without it the test skips locally but fails
// under CI=true: CI must never pass without checking the rules.
// MANDATED_PROMTOOL names a promtool binary explicitly.
func promtool(t *testing.T) string {
	t.Helper()
	promtoolOnce.Do(func() {
		if p := os.Getenv("MANDATED_PROMTOOL"); p != "" {
			promtoolPath = p
			return
		}
		if p, err := exec.LookPath("promtool"); err == nil {
			promtoolPath = p
			return
		}
		promtoolPath, promtoolWhy = installPromtool(t)
	})
	if promtoolPath == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool is required under CI=true and could not be obtained: %s\n"+
				"install it (apt-get install -y prometheus, or a Prometheus release's promtool) or set MANDATED_PROMTOOL", promtoolWhy)
		}
		t.Skipf("promtool is not available (%s); install it (apt-get install -y prometheus) to check the alert rules", promtoolWhy)
	}
	return promtoolPath
}

// installPromtool runs apt-get as root, or through passwordless sudo. The
// image's policy-rc.d (or the absence of an init system) keeps the
// prometheus service from starting; only promtool is used.
func installPromtool(t *testing.T) (string, string) {
	aptGet, err := exec.LookPath("apt-get")
	if err != nil {
		return "", "promtool is not on PATH and there is no apt-get to install it"
	}
	var prefix []string
	if os.Geteuid() != 0 {
		if exec.Command("sudo", "-n", "true").Run() != nil {
			return "", "promtool is not on PATH, and installing it needs root (no passwordless sudo)"
		}
		prefix = []string{"sudo", "-n"}
	}
	apt := func(args ...string) error {
		full := append(append(append([]string{}, prefix...), aptGet), args...)
		cmd := exec.Command(full[0], full[1:]...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err != nil {
			t.Logf("apt-get %v: %v\n%s", args, err, out.String())
		}
		return err
	}
	install := []string{"install", "-y", "--no-install-recommends", "prometheus"}
	t.Logf("promtool is not on PATH: installing Debian's prometheus package for it")
	if apt(install...) != nil {
		if err := apt("update"); err != nil {
			return "", "apt-get update failed: " + err.Error()
		}
		if err := apt(install...); err != nil {
			return "", "apt-get install prometheus failed: " + err.Error()
		}
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		return "", "the prometheus package installed no promtool on PATH"
	}
	return p, ""
}

func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = deployPath(t, "prometheus")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %v:\n%s", args, out)
	return string(out)
}

func TestPromtool(t *testing.T) {
	t.Parallel()
	t.Run("check rules passes on the alert rules", func(t *testing.T) {
		out := runPromtool(t, "check", "rules", "alerts.yaml")
		require.Contains(t, out, "SUCCESS")
	})
	t.Run("check config passes on the compose Prometheus configuration", func(t *testing.T) {
		out := runPromtool(t, "check", "config", "prometheus.yaml")
		require.Contains(t, out, "SUCCESS")
	})
	t.Run("the alert rules' unit tests pass", func(t *testing.T) {
		out := runPromtool(t, "test", "rules", "alerts_test.yaml")
		require.Contains(t, out, "SUCCESS")
	})
	t.Run("every file promtool is given exists", func(t *testing.T) {
		for _, f := range []string{"alerts.yaml", "alerts_test.yaml", "prometheus.yaml", "blackbox.yaml"} {
			_, err := os.Stat(filepath.Join(deployPath(t, "prometheus"), f))
			require.NoError(t, err)
		}
	})
}
