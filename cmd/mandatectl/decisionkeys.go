package main

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

func decisionKeysCommand() *command {
	return group(&command{
		name:    "decision-keys",
		group:   groupSetup,
		summary: "the deployment's keys that sign every published record (generate, add, revoke, list)",
		usage:   "generate|add|revoke|list [flags]",
		description: `Decision keys are the deployment's: mandated signs every record it publishes
(decisions and dead letters) with one, over the record's chain hash, in the
mandated-signature header. Someone holding mandated's Kafka credential can
continue the chain but cannot sign: recover, verify, the relay's tail reads,
the gateway and the Go client believe only records a registered key signed.

  generate --private-key-file F   make a key pair; prints its id and public key (PEM)
  add --public-key-file F [--valid-from T] [--valid-until T] [--note N]
  revoke <key-id> [--at T]         records it signs at or after T do not count
  list [--json]                    keys with their window and state (what callers verify with)

Give mandated the private key (--decision-signing-key-file, a mounted
secret); register the public key first, so that every backup taken from then
on knows it. Rotation: add the next key, give it to mandated, then revoke the
old one as of the restart (it keeps verifying what it signed before).`,
	},
		leaf(&command{
			name:    "generate",
			summary: "make a key pair; prints its id and public key (PEM)",
			usage:   "--private-key-file FILE",
			description: `Generate the deployment's Ed25519 decision key pair. The private key is
written to --private-key-file (PKCS#8 PEM, mode 0600; the file must not
exist): it is mandated's (--decision-signing-key-file), never a caller's. The
key id and the public key (PKIX PEM) are printed, for 'decision-keys add'
and for the callers that check signatures.`,
			examples: []string{"mandatectl decision-keys generate --private-key-file decisions-2026-12.pem > decisions-2026-12.pub.pem"},
		}, runDecisionKeysGenerate),
		leaf(&command{
			name:    "add",
			summary: "register a decision key of the deployment",
			usage:   "--public-key-file FILE [--valid-from T] [--valid-until T] [flags]",
			description: `Register a decision key of the deployment (its id is derived from the
public key). Records it signs count from --valid-from (default now). Times
are RFC 3339 or a duration from now (90m, 30d). Register a key before
mandated signs with it, so every backup taken after knows it; after a
restore, add again the keys added since the backup, with the --valid-from
they had (mandatectl decision-keys list on the live database said it).`,
			examples: []string{"mandatectl decision-keys add --public-key-file decisions-2026-12.pub.pem"},
		}, runDecisionKeysAdd),
		leaf(&command{
			name:    "revoke",
			summary: "records it signs at or after --at do not count",
			usage:   "<key-id> [--at T] [flags]",
			description: `Revoke a decision key as of --at (default now): records it signed at or
after that time do not count (a rotated key, or one that leaked); what it
signed before keeps verifying. The key stays on record.`,
			examples: []string{"mandatectl decision-keys revoke 3f2a9c0d1e4b5a68"},
		}, runDecisionKeysRevoke),
		leaf(&command{
			name:    "list",
			summary: "keys with their window and state (what callers verify with)",
			usage:   "[--json] [flags]",
			description: `List the deployment's decision keys with their window and their state now
(valid, not_yet_valid, expired, revoked). --json gives each public key
(PKIX PEM): what a caller that checks signatures is configured with.`,
			examples: []string{"mandatectl decision-keys list --json"},
		}, runDecisionKeysList),
	)
}

// keyFileOptions are a key generator's: where to write the private key.
type keyFileOptions struct{ file string }

func (o *keyFileOptions) register(f *flagSet) {
	f.StringVar(&o.file, "private-key-file", "", "where to write the private key (required)")
}

func (o *keyFileOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.file == "" {
		return errors.New("--private-key-file is required")
	}
	return nil
}

func runDecisionKeysGenerate(_ context.Context, a *app, o *keyFileOptions) int {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err == nil {
		err = writePrivateKey(o.file, priv)
	}
	if err != nil {
		a.errorf("decision-keys generate: %v", err)
		return exitFailed
	}
	fmt.Fprintf(a.stderr, "decision key %s: private key in %s\n", wire.DecisionKeyID(pub), o.file)
	fmt.Fprint(a.stdout, wire.PublicKeyPEM(pub))
	return exitOK
}

// validFrom is when a key added with --valid-from and --valid-until
// starts to count (now when --valid-from is not given); --valid-until
// must come after it.
func validFrom(from, until timeFlag) (time.Time, error) {
	t := from.t
	if t.IsZero() {
		t = time.Now()
	}
	if !until.t.IsZero() && !until.t.After(t) {
		return time.Time{}, errors.New("--valid-until must be after --valid-from")
	}
	return t, nil
}

// writePrivateKey writes priv as PKCS#8 PEM to a new file only its owner reads.
func writePrivateKey(path string, priv ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return errors.Join(pem.Encode(out, &pem.Block{Type: "PRIVATE KEY", Bytes: der}), out.Close())
}

type decisionKeysAddOptions struct {
	db                    dbConn
	pubFile               string
	validFrom, validUntil timeFlag
	note                  string
	timeout               time.Duration

	pub  ed25519.PublicKey
	from time.Time
}

func (o *decisionKeysAddOptions) register(f *flagSet) {
	o.db.register(f)
	f.StringVar(&o.pubFile, "public-key-file", "", "the public key: PKIX PEM (required)")
	f.Var(&o.validFrom, "valid-from", "records made from this `time` on count (default: now)")
	f.Var(&o.validUntil, "valid-until", "records made from this `time` on do not count (default: never)")
	f.StringVar(&o.note, "note", "", "free text kept with the key")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole command")
}

func (o *decisionKeysAddOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.pubFile == "" {
		return errors.New("--public-key-file is required")
	}
	b, err := os.ReadFile(o.pubFile)
	if err != nil {
		return fmt.Errorf("--public-key-file: %w", err)
	}
	if o.pub, err = wire.ParsePublicKeyPEM(b); err != nil {
		return fmt.Errorf("--public-key-file: %w", err)
	}
	if o.from, err = validFrom(o.validFrom, o.validUntil); err != nil {
		return err
	}
	_, err = o.db.resolve()
	return err
}

func runDecisionKeysAdd(ctx context.Context, a *app, o *decisionKeysAddOptions) int {
	return withGrantorKeysConn(ctx, a, &o.db, o.timeout, func(ctx context.Context, q sink.KeyQuerier) error {
		id, err := sink.AddDecisionKey(ctx, q, o.pub, o.from, o.validUntil.t, o.note)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "added decision key %s, valid from %s until %s\n", id, fmtTime(o.from), validUntilText(o.validUntil.t))
		return nil
	})
}

type decisionKeysRevokeOptions struct {
	db      dbConn
	at      timeFlag
	timeout time.Duration

	keyID string
	when  time.Time
}

func (o *decisionKeysRevokeOptions) register(f *flagSet) {
	o.db.register(f)
	f.Var(&o.at, "at", "records made from this `time` on do not count (default: now)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole command")
}

func (o *decisionKeysRevokeOptions) validate(in given) error {
	if len(in.args) != 1 {
		return errors.New("one key id is required")
	}
	o.keyID, o.when = in.args[0], o.at.t
	if o.when.IsZero() {
		o.when = time.Now()
	}
	_, err := o.db.resolve()
	return err
}

func runDecisionKeysRevoke(ctx context.Context, a *app, o *decisionKeysRevokeOptions) int {
	return withGrantorKeysConn(ctx, a, &o.db, o.timeout, func(ctx context.Context, q sink.KeyQuerier) error {
		if err := sink.RevokeDecisionKey(ctx, q, o.keyID, o.when); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "revoked decision key %s as of %s\n", o.keyID, fmtTime(o.when))
		return nil
	})
}

type decisionKeyView struct {
	KeyID      string     `json:"key_id"`
	Alg        string     `json:"alg"`
	PublicKey  string     `json:"public_key"` // PKIX PEM
	ValidFrom  time.Time  `json:"valid_from"`
	ValidUntil *time.Time `json:"valid_until,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	State      string     `json:"state"`
	Note       string     `json:"note,omitempty"`
}

type decisionKeysListOptions struct {
	db      dbConn
	asJSON  bool
	timeout time.Duration
}

func (o *decisionKeysListOptions) register(f *flagSet) {
	o.db.register(f)
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the query")
}

func (o *decisionKeysListOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	_, err := o.db.resolve()
	return err
}

func runDecisionKeysList(ctx context.Context, a *app, o *decisionKeysListOptions) int {
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	pool, err := o.db.pool(ctx)
	if err != nil {
		a.errorf("decision-keys list: %v", err)
		return exitFailed
	}
	defer pool.Close()
	keys, err := sink.DecisionKeyRows(ctx, pool)
	if err != nil {
		a.errorf("decision-keys list: %v", err)
		return exitFailed
	}
	now := time.Now()
	state := func(k sink.DecisionKeyRow) string {
		return grantorKeyState(sink.GrantorKey{ValidFrom: k.ValidFrom, ValidUntil: k.ValidUntil, RevokedAt: k.RevokedAt}, now)
	}
	if o.asJSON {
		views := make([]decisionKeyView, 0, len(keys))
		for _, k := range keys {
			v := decisionKeyView{KeyID: k.KeyID, Alg: k.Alg, PublicKey: wire.PublicKeyPEM(k.PublicKey), ValidFrom: k.ValidFrom.UTC(),
				State: state(k), Note: k.Note}
			if !k.ValidUntil.IsZero() {
				t := k.ValidUntil.UTC()
				v.ValidUntil = &t
			}
			if !k.RevokedAt.IsZero() {
				t := k.RevokedAt.UTC()
				v.RevokedAt = &t
			}
			views = append(views, v)
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{"keys": views})
		return exitOK
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "KEY ID\tSTATE\tVALID FROM\tVALID UNTIL\tREVOKED\tNOTE")
	for _, k := range keys {
		revoked := "-"
		if !k.RevokedAt.IsZero() {
			revoked = fmtTime(k.RevokedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.KeyID, state(k), fmtTime(k.ValidFrom), validUntilText(k.ValidUntil), revoked, dash(k.Note))
	}
	_ = tw.Flush()
	return exitOK
}
