package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Kafka holds how to reach Kafka.
type Kafka struct {
	Brokers          string
	TLS              bool
	TLSCAFile        string
	TLSCertFile      string
	TLSKeyFile       string
	TLSServerName    string
	SASLMechanism    string
	SASLUser         string
	SASLPassword     string
	SASLPasswordFile string
	ClientIDForLogs  string
}

// Register adds the Kafka flags.
func (k *Kafka) Register(fs *flag.FlagSet) {
	fs.StringVar(&k.Brokers, "brokers", "", "Kafka seed brokers, comma separated (required)")
	fs.BoolVar(&k.TLS, "kafka-tls", false, "connect to Kafka over TLS")
	fs.StringVar(&k.TLSCAFile, "kafka-tls-ca-file", "", "PEM file of CAs to trust for Kafka (default: the system pool)")
	fs.StringVar(&k.TLSCertFile, "kafka-tls-cert-file", "", "PEM client certificate for Kafka mTLS")
	fs.StringVar(&k.TLSKeyFile, "kafka-tls-key-file", "", "PEM client key for Kafka mTLS")
	fs.StringVar(&k.TLSServerName, "kafka-tls-server-name", "", "server name to verify (default: the broker host)")
	fs.StringVar(&k.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: scram-sha-256, scram-sha-512 or plain (default: none)")
	fs.StringVar(&k.SASLUser, "kafka-sasl-user", "", "SASL user")
	fs.StringVar(&k.SASLPassword, "kafka-sasl-password", "", "SASL password (prefer --kafka-sasl-password-file or the environment)")
	fs.StringVar(&k.SASLPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password")
}

// SeedBrokers returns the broker list, or an error naming the flag.
func (k *Kafka) SeedBrokers() ([]string, error) {
	b := List(k.Brokers)
	if len(b) == 0 {
		return nil, fmt.Errorf("--brokers (%s) is required", EnvName("brokers"))
	}
	return b, nil
}

// Opts builds the client options for TLS and SASL.
func (k *Kafka) Opts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if k.TLS || k.TLSCAFile != "" || k.TLSCertFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.TLSServerName}
		if k.TLSCAFile != "" {
			pem, err := os.ReadFile(k.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("--kafka-tls-ca-file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, errors.New("--kafka-tls-ca-file: no PEM certificates found")
			}
			cfg.RootCAs = pool
		}
		if (k.TLSCertFile == "") != (k.TLSKeyFile == "") {
			return nil, errors.New("--kafka-tls-cert-file and --kafka-tls-key-file go together")
		}
		if k.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(k.TLSCertFile, k.TLSKeyFile)
			if err != nil {
				return nil, fmt.Errorf("--kafka-tls-cert-file/--kafka-tls-key-file: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if k.SASLMechanism != "" {
		pass, err := Secret(k.SASLPassword, k.SASLPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("--kafka-sasl-password-file: %w", err)
		}
		if k.SASLUser == "" || pass == "" {
			return nil, errors.New("--kafka-sasl-user and a password (--kafka-sasl-password-file or MANDATED_KAFKA_SASL_PASSWORD) are required with --kafka-sasl-mechanism")
		}
		switch strings.ToLower(k.SASLMechanism) {
		case "scram-sha-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: k.SASLUser, Pass: pass}.AsSha256Mechanism()))
		case "scram-sha-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: k.SASLUser, Pass: pass}.AsSha512Mechanism()))
		case "plain":
			opts = append(opts, kgo.SASL(plain.Auth{User: k.SASLUser, Pass: pass}.AsMechanism()))
		default:
			return nil, fmt.Errorf("--kafka-sasl-mechanism %q is not scram-sha-256, scram-sha-512 or plain", k.SASLMechanism)
		}
	}
	return opts, nil
}

// DaemonOpts is what a daemon connects to Kafka with: the seed brokers and
// the client options (TLS, SASL), franz-go's own messages logged at warn
// and above through log.
func (k *Kafka) DaemonOpts(log zerolog.Logger) ([]string, []kgo.Opt, error) {
	brokers, err := k.SeedBrokers()
	if err != nil {
		return nil, nil, err
	}
	opts, err := k.Opts()
	if err != nil {
		return nil, nil, err
	}
	return brokers, append(opts, kgo.WithLogger(KafkaLogger(log, kgo.LogLevelWarn))), nil
}
