package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// testCA is a certificate authority made by the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert issues a server certificate for the given IP addresses.
func (ca *testCA) serverCert(t *testing.T, ips ...net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "postgres"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// tlsURL is u with a password (trust auth ignores it; the logs must not
// show it), sslmode and sslrootcert, and host instead of 127.0.0.1.
func tlsURL(t *testing.T, u, host, mode, rootCert, password string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	parsed.User = url.UserPassword("postgres", password)
	parsed.Host = strings.Replace(parsed.Host, "127.0.0.1", host, 1)
	q := parsed.Query()
	q.Set("sslmode", mode)
	q.Set("sslrootcert", rootCert)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// TestMandatedConnectsToPostgreSQLWithVerifyFullAndRefusesAWrongCA: a
// PostgreSQL with a certificate from a CA the test made; mandated with
// sslmode=verify-full decides over TLS; the wrong CA, or a host name the
// certificate does not name, is refused with an error that says what to
// check, and the URL's password never reaches a log.
func TestMandatedConnectsToPostgreSQLWithVerifyFullAndRefusesAWrongCA(t *testing.T) {
	t.Parallel()
	ca, wrong := newCA(t, "mandated test CA"), newCA(t, "some other CA")
	certPEM, keyPEM := ca.serverCert(t, net.ParseIP("127.0.0.1"))
	pg := testenv.PrivatePostgres(t)
	pg.EnableTLS(t, certPEM, keyPEM)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL, err := pg.Database(ctx, "mandated_tls")
	require.NoError(t, err)
	caFile, wrongFile := writeFile(t, "ca.pem", ca.pem), writeFile(t, "wrong-ca.pem", wrong.pem)
	const password = "pg-secret-7f3a9c"

	// The storage layer, in-process: each refusal names its cause and what to check.
	for _, tc := range []struct {
		name, host, file, want string
	}{
		{"a CA that did not sign the certificate", "127.0.0.1", wrongFile, "certificate signed by unknown authority"},
		{"a host name the certificate does not name", "localhost", caFile, "wanted to match localhost"},
	} {
		_, err := sink.Open(ctx, sink.Config{DatabaseURL: tlsURL(t, dbURL, tc.host, "verify-full", tc.file, password)}, zerolog.Nop())
		require.Error(t, err, tc.name)
		require.Contains(t, err.Error(), tc.want, tc.name)
		require.Contains(t, err.Error(), "sslrootcert must name the CA", tc.name)
		require.NotContains(t, err.Error(), password, tc.name)
	}

	h := harness.New(t, harness.Options{})
	args := func(u string) []string {
		a := mandatedArgs(h)
		for i := range a {
			if a[i] == "--database-url" {
				a = append(a[:i], a[i+2:]...)
				break
			}
		}
		return append(a, "--database-url-file", writeFile(t, "db-url", []byte(u)))
	}

	bad := procs.StartMandated(t, "pg-wrong-ca", args(tlsURL(t, dbURL, "127.0.0.1", "verify-full", wrongFile, password)), nil)
	testenv.WaitFor(t, 60*time.Second, func() bool {
		_, body, err := bad.Get("/readyz")
		return err == nil && strings.Contains(body, "certificate signed by unknown authority")
	}, "/readyz says the certificate is not trusted")
	bad.Kill()
	require.Contains(t, bad.Log(), "sslrootcert must name the CA")
	require.NotContains(t, bad.Log(), password)

	good := procs.StartMandated(t, "pg-tls", args(tlsURL(t, dbURL, "127.0.0.1", "verify-full", caFile, password)), nil)
	good.WaitReady(90 * time.Second)
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("acme", "m", 1)).Outcome)
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(proposeCmd("acme", "m", "k", 100)).Outcome)

	// Every session mandated holds is encrypted.
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var tlsSessions, plain int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'mandated/%'`).Scan(&tlsSessions, &plain))
	require.Positive(t, tlsSessions, "mandated's sessions use TLS")
	require.Zero(t, plain, "no mandated session is unencrypted")

	good.Signal(syscall.SIGTERM)
	code, err := good.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code)
	require.NotContains(t, good.Log(), password, "the database password never reaches the logs")
}
