package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
)

// Kafka's own kafka-consumer-groups (ConsumerGroupCommand, from the
// kafka-tools jar the test servers resolve) describes mandated's
// consumer-protocol group as operators expect: every member, and each
// member holding partition p of both input topics.
func TestKafkasConsumerGroupToolDescribesTheGroupCoPartitioned(t *testing.T) {
	t.Parallel()
	java, err := exec.LookPath("java")
	require.NoError(t, err, "java runs the Kafka tools")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := testenv.Script(ctx, "kafka-libs.sh", nil)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	libs := lines[len(lines)-1]

	h := harness.New(t, harness.Options{Partitions: 4})
	a, b := h.Start("a"), h.Start("b")
	testenv.WaitFor(t, time.Minute, func() bool {
		return len(a.Service.Processor.Owned()) == 2 && len(b.Service.Processor.Owned()) == 2
	}, "two processors own two partitions each")

	// The group may still be reconciling right after the ownership moved:
	// describe until both members show their whole assignment.
	var members map[string][]string
	testenv.WaitFor(t, time.Minute, func() bool {
		cmd := exec.CommandContext(ctx, java, "-cp", filepath.Join(libs, "*"),
			"org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
			"--bootstrap-server", strings.Join(h.Brokers, ","), "--describe", "--group", h.Group, "--members", "--verbose")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", b)
		members = assignments(string(b), h.Spec.Proposals, h.Spec.Grants)
		return len(members) == 2 && len(members[memberKeys(members)[0]])+len(members[memberKeys(members)[1]]) == 8
	}, "kafka-consumer-groups shows two members with all eight partitions")
	seen := map[string]bool{}
	for m, tps := range members {
		var props, grants []string
		for _, tp := range tps {
			topic, p, _ := strings.Cut(tp, ":")
			switch topic {
			case h.Spec.Proposals:
				props = append(props, p)
			case h.Spec.Grants:
				grants = append(grants, p)
			}
			require.False(t, seen[tp], "%s assigned twice", tp)
			seen[tp] = true
		}
		sort.Strings(props)
		sort.Strings(grants)
		require.Len(t, props, 2, "member %s", m)
		require.Equal(t, props, grants, "member %s holds partition p of both topics", m)
	}
}

// assignments reads `--describe --members --verbose` of a consumer-protocol
// group: per member id (CONSUMER-ID), "topic:partition" entries of its
// CURRENT-ASSIGNMENT ("topicA:0,1;topicB:0,1") of the two input topics,
// kept only once its TARGET-ASSIGNMENT is the same (reconciled).
func assignments(out, proposals, grants string) map[string][]string {
	members := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] == "GROUP" || f[6] != f[8] {
			continue
		}
		for _, part := range strings.Split(f[6], ";") {
			i := strings.LastIndex(part, ":")
			if i < 0 || (part[:i] != proposals && part[:i] != grants) {
				continue
			}
			for _, p := range strings.Split(part[i+1:], ",") {
				members[f[1]] = append(members[f[1]], fmt.Sprintf("%s:%s", part[:i], p))
			}
		}
	}
	return members
}

func memberKeys(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return append(out, "", "")
}
