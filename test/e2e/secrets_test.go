package e2e

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// secretForms are the ways a secret could show up in a log line: as is,
// URL-escaped, base64 and hex.
func secretForms(s []byte) []string {
	return []string{string(s), url.QueryEscape(string(s)), url.PathEscape(string(s)),
		base64.StdEncoding.EncodeToString(s), base64.RawURLEncoding.EncodeToString(s), hex.EncodeToString(s)}
}

// TestNoSecretReachesAnyLogLine runs mandated at debug level, as a SASL
// user whose password comes from the environment, on a database URL with a
// password, through grants signed with a grantor key, rejected forgeries, a
// refused SASL login and a refused database login; then it reads every
// line mandated and mandatectl wrote, and the /metrics and /readyz pages,
// and finds none of the secrets in any form.
func TestNoSecretReachesAnyLogLine(t *testing.T) {
	t.Parallel()
	sasl := testenv.SASLBrokers(t)
	h := harness.New(t, harness.Options{Brokers: sasl.Brokers, KafkaOpts: sasl.Opts(), Partitions: 2})
	dbPassword := "db-pw-" + strings.Repeat("q7", 8)
	dbURL, err := url.Parse(h.DatabaseURL)
	require.NoError(t, err)
	dbURL.User = url.UserPassword("postgres", dbPassword) // trust auth: accepted, never checked
	wrongSASL := "wrong-sasl-pw-5c1e"

	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	require.NoError(t, err)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	keyFile := writeFile(t, "grantor.pem", keyPEM)
	pubDER, err := x509.MarshalPKIXPublicKey(priv.Public())
	require.NoError(t, err)
	pubFile := writeFile(t, "grantor.pub.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))

	secrets := map[string][]string{
		"the SASL password":       secretForms([]byte(sasl.Password)),
		"a wrong SASL password":   secretForms([]byte(wrongSASL)),
		"the database password":   secretForms([]byte(dbPassword)),
		"the grantor private key": append(secretForms(priv.Seed()), secretForms(der)...),
	}
	for _, line := range strings.Split(string(keyPEM), "\n") {
		if !strings.HasPrefix(line, "-----") && len(line) > 16 {
			secrets["the grantor private key"] = append(secrets["the grantor private key"], line)
		}
	}

	var logs []string // every output, in the order it was made
	mandatectl := procs.Binary(t, "mandatectl")
	ctl := func(env []string, args ...string) (string, int) {
		c := exec.Command(mandatectl, args...)
		c.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		out, _ := c.CombinedOutput()
		logs = append(logs, string(out))
		return string(out), c.ProcessState.ExitCode()
	}
	kafkaEnv := []string{"MANDATED_BROKERS=" + joinComma(sasl.Brokers), "MANDATED_KAFKA_SASL_MECHANISM=scram-sha-256",
		"MANDATED_KAFKA_SASL_USER=" + sasl.User, "MANDATED_KAFKA_SASL_PASSWORD=" + sasl.Password,
		"MANDATED_PROPOSALS_TOPIC=" + h.Spec.Proposals, "MANDATED_GRANTS_TOPIC=" + h.Spec.Grants,
		"MANDATED_DECISIONS_TOPIC=" + h.Spec.Decisions, "MANDATED_DEAD_LETTER_TOPIC=" + h.Spec.DeadLetter,
		"MANDATED_DATABASE_URL=" + dbURL.String()}

	args := append(mandatedArgs(h), "--log-level", "debug", "--kafka-sasl-mechanism", "scram-sha-256", "--kafka-sasl-user", sasl.User)
	for i := range args {
		if args[i] == "--database-url" {
			args[i+1] = dbURL.String()
		}
	}
	p := procs.StartMandated(t, "secrets", args, []string{"MANDATED_KAFKA_SASL_PASSWORD=" + sasl.Password})
	p.WaitReady(90 * time.Second)

	out, code := ctl(kafkaEnv, "grantor-keys", "add", "acme", "g1", "--public-key-file", pubFile)
	require.Zero(t, code, out)
	out, code = ctl(kafkaEnv, "grantor-keys", "require", "acme")
	require.Zero(t, code, out)
	out, code = ctl(kafkaEnv, "grant", "--org", "acme", "--mandate", "m", "--operation", "refund", "--max-amount", "100",
		"--currency", "EUR", "--signing-key-file", keyFile, "--signing-key-id", "g1", "--timeout", "60s")
	require.Zero(t, code, out)
	out, code = ctl(kafkaEnv, "grant", "--org", "acme", "--mandate", "m2", "--operation", "refund", "--max-amount", "100",
		"--currency", "EUR", "--timeout", "60s")
	require.Equal(t, 2, code, "an unsigned grant is rejected: %s", out)
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(proposeCmd("acme", "m", "k", 100)).Outcome)
	out, code = ctl(kafkaEnv, "tail", "--from-beginning", "--max", "3")
	require.Zero(t, code, out)

	// Refused logins: the wrong SASL password and an unreachable database
	// with a password in its URL.
	badKafka := append(append([]string(nil), kafkaEnv...), "MANDATED_KAFKA_SASL_PASSWORD="+wrongSASL)
	out, code = ctl(badKafka, "topics", "check", "--timeout", "20s")
	require.NotZero(t, code, out)
	badDB := *dbURL
	badDB.Host = "127.0.0.1:1"
	out, code = ctl([]string{"MANDATED_DATABASE_URL=" + badDB.String()}, "partitions", "--timeout", "5s")
	require.NotZero(t, code, out)

	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		_, body, err := p.Get(path)
		require.NoError(t, err)
		logs = append(logs, body)
	}
	p.Signal(syscall.SIGTERM)
	code, err = p.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code)
	logs = append(logs, p.Log())
	b, err := os.ReadFile(p.LogPath)
	require.NoError(t, err)
	require.Greater(t, bytes.Count(b, []byte("\n")), 10, "mandated logged at debug level")
	require.Contains(t, string(b), `"level":"debug"`)

	leaked := func(line string) string {
		for what, forms := range secrets {
			for _, f := range forms {
				if strings.Contains(line, f) {
					return what
				}
			}
		}
		return ""
	}
	require.Equal(t, "the database password", leaked(`{"url":"`+dbURL.String()+`"}`), "the check finds a URL with the password")
	require.Equal(t, "the grantor private key", leaked(string(keyPEM)), "the check finds the key file")

	lines := 0
	for _, l := range logs {
		for _, line := range strings.Split(l, "\n") {
			lines++
			require.Empty(t, leaked(line), "a secret appears in a log line")
		}
	}
	t.Logf("checked %d lines for %d secrets", lines, len(secrets))
}
