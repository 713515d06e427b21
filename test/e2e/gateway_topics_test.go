package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
)

// TestAGatewayStartedBeforeItsTopicsSaysSoOnReadyzAndInItsLog: a newcomer
// starts mandate-gateway before `mandatectl topics create`. Its /readyz
// answers at once, 503, naming the missing topics and the command that
// creates them, and so does its log; once the topics exist it becomes ready
// without a restart.
func TestAGatewayStartedBeforeItsTopicsSaysSoOnReadyzAndInItsLog(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	prefix := testenv.Name(t, "gwtopics") + "."
	topics := []string{prefix + "proposals", prefix + "grants", prefix + "decisions"}
	api, ops := procs.FreePort(t), procs.FreePort(t)
	gw := procs.Start(t, "gateway", procs.Binary(t, "mandate-gateway"), []string{
		"--database-url", testenv.Database(t), "--brokers", strings.Join(brokers, ","),
		"--proposals-topic", topics[0], "--grants-topic", topics[1], "--decisions-topic", topics[2],
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", api), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", ops),
		"--log-format", "json",
	}, nil)
	gw.HTTP = fmt.Sprintf("127.0.0.1:%d", ops)

	var body string
	testenv.WaitFor(t, time.Minute, func() bool {
		code, b, err := gw.Get("/readyz")
		body = b
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(b, "mandatectl topics create")
	}, "the gateway's /readyz answers 503 naming the missing topics and mandatectl topics create")
	require.Contains(t, body, "the topics do not exist yet")
	testenv.WaitFor(t, 30*time.Second, func() bool {
		return strings.Contains(gw.Log(), "the topics do not exist yet (create them: mandatectl topics create)")
	}, "the gateway's log says the topics do not exist")

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = adm.CreateTopics(ctx, 2, 1, nil, topics...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topics...)
	})
	gw.WaitReady(time.Minute)
}
