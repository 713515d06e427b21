// Package e2e runs the real mandated binaries against the real broker and
// PostgreSQL, as operators run them.
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/harness"

	"github.com/mandated/mandated/test/testenv"
)

func TestMain(m *testing.M) {
	testenv.SkipPackageInShortTier("end to end with real mandated processes")
	goleak.VerifyTestMain(m)
}

// mandatedArgs are the flags that point a mandated process at a harness's
// database, topics, group and transactional ids.
func mandatedArgs(h *harness.Harness) []string {
	return []string{
		"--brokers", joinComma(h.Brokers), "--database-url", h.DatabaseURL,
		"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter,
		"--group", h.Group, "--relay-transactional-id-prefix", h.TxnPrefix,
		"--session-timeout", "6s", "--rebalance-timeout", "20s", "--takeover-grace", "1s",
		"--relay-idle-poll", "200ms", "--shutdown-timeout", "20s",
	}
}

// ctlArgs point mandatectl at a harness's servers and topics.
func ctlArgs(h *harness.Harness) []string {
	return []string{
		"--brokers", joinComma(h.Brokers), "--database-url", h.DatabaseURL,
		"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter,
		"--group", h.Group,
	}
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

func writeSecret(t *testing.T, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func cmd(typ, org, mandate string, extra map[string]any) map[string]any {
	m := map[string]any{"type": typ, "org": org, "mandate_id": mandate}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func money(units int) map[string]any { return map[string]any{"minor_units": units, "currency": "EUR"} }

func grantCmd(org, mandate string, uses int) map[string]any {
	return cmd("grant", org, mandate, map[string]any{"uses": uses, "max_amount": money(20000), "operations": []string{"refund"}})
}

func proposeCmd(org, mandate, key string, units int) map[string]any {
	return cmd("propose", org, mandate, map[string]any{"idempotency_key": key, "operation": "refund",
		"target": "customer-1", "amount": money(units)})
}

var _ = fmt.Sprintf
