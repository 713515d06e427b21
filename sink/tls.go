package sink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// tlsHint adds what to check to a connection error that comes from
// verifying PostgreSQL's certificate (sslmode=verify-ca or verify-full), so
// an operator reads "wrong CA or host name" instead of a bare x509 error.
func tlsHint(err error) error {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	if err == nil || !(errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) ||
		errors.As(err, &invalid) || strings.Contains(err.Error(), "x509: ")) {
		return err
	}
	return fmt.Errorf("%w (PostgreSQL's TLS certificate failed verification: the URL's sslrootcert must name the CA that signed "+
		"the server's certificate, and with sslmode=verify-full the URL's host must be one of the certificate's names)", err)
}
