package main

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/cmd/internal/cli"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

func grantorKeysCommand() *command {
	return group(&command{
		name:    "grantor-keys",
		group:   groupSetup,
		summary: "grantor signing keys and each org's grant_signing (generate, add, revoke, list, require, relax)",
		usage:   "generate|add|revoke|list|require|relax [flags]",
		description: `Grantor keys sign grant, revoke and resolve commands (Ed25519). mandated
verifies a signature against the keys registered for the command's org;
with grant_signing required for the org, an unsigned grantor command is
rejected, so writing the grants topic alone cannot mint authority.

  generate --private-key-file F   make a key pair; prints the public key (PEM)
  add <org> <key-id> --public-key-file F [--valid-from T] [--valid-until T]
  revoke <org> <key-id>           the key stops signing at once (kept on record)
  list [<org>] [--json]           keys with their validity and state
  require <org>                   grant_signing=required: unsigned grantor commands are rejected
  relax <org>                     grant_signing=off (the default)

Rotation: add the new key, move grantors to it (mandatectl grant
--signing-key-file), then revoke the old one or let its --valid-until pass.
Changes reach running processors within --grantor-key-refresh (5s); a new
key is usable at once.`,
	},
		leaf(&command{
			name:    "generate",
			summary: "make a key pair; prints the public key (PEM)",
			usage:   "--private-key-file FILE",
			description: `Generate an Ed25519 key pair for a grantor. The private key is written to
--private-key-file (PKCS#8 PEM, mode 0600; the file must not exist); the
public key is printed (PKIX PEM) for 'mandatectl grantor-keys add'. The
private key belongs to the grantor, never to mandated.`,
			examples: []string{"mandatectl grantor-keys generate --private-key-file grantor-2026-11.pem > grantor-2026-11.pub.pem"},
		}, runGrantorKeysGenerate),
		leaf(&command{
			name:    "add",
			summary: "register a grantor's public key for an org",
			usage:   "<org> <key-id> --public-key-file FILE [--valid-from T] [--valid-until T] [flags]",
			description: `Register a grantor's public key for an org. Key ids are never reused
within an org, so a decision's signed_by names one key forever. Times are
RFC 3339 or a duration from now (90m, 30d).`,
			examples: []string{"mandatectl grantor-keys add acme grantor-2026-11 --public-key-file grantor-2026-11.pub.pem --valid-until 400d"},
		}, runGrantorKeysAdd),
		leaf(&command{
			name:    "revoke",
			summary: "the key stops signing at once (kept on record)",
			usage:   "<org> <key-id> [flags]",
			description: `Revoke a grantor key now: commands it signs are rejected
(signature_key_revoked) once processors refresh their keys (within
--grantor-key-refresh). The key stays on record for the decisions it signed.`,
			examples: []string{"mandatectl grantor-keys revoke acme grantor-2026-11"},
		}, runGrantorKeysRevoke),
		leaf(&command{
			name:    "list",
			summary: "keys with their validity and state",
			usage:   "[<org>] [--json] [flags]",
			description: `List grantor keys (of one org, or all) with their validity window, their
state now (valid, not_yet_valid, expired, revoked) and each org's
grant_signing setting.`,
			examples: []string{"mandatectl grantor-keys list acme"},
		}, runGrantorKeysList),
		signingModeCommand(sink.SigningRequired, "grant_signing=required: unsigned grantor commands are rejected"),
		signingModeCommand(sink.SigningOff, "grant_signing=off (the default)"),
	)
}

func runGrantorKeysGenerate(_ context.Context, a *app, o *keyFileOptions) int {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err == nil {
		err = writePrivateKey(o.file, priv)
	}
	var pubDER []byte
	if err == nil {
		pubDER, err = x509.MarshalPKIXPublicKey(pub)
	}
	if err != nil {
		a.errorf("grantor-keys generate: %v", err)
		return exitFailed
	}
	_ = pem.Encode(a.stdout, &pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return exitOK
}

type grantorKeysAddOptions struct {
	db                    dbConn
	pubFile               string
	validFrom, validUntil timeFlag
	note                  string
	timeout               time.Duration

	org, keyID string
	pub        ed25519.PublicKey
	from       time.Time
}

func (o *grantorKeysAddOptions) register(f *flagSet) {
	o.db.register(f)
	f.StringVar(&o.pubFile, "public-key-file", "", "the public key: PKIX PEM (openssl pkey -pubout) (required)")
	f.Var(&o.validFrom, "valid-from", "the key signs from this `time` on (default: now)")
	f.Var(&o.validUntil, "valid-until", "the key stops signing at this `time` (default: never)")
	f.StringVar(&o.note, "note", "", "free text kept with the key (who holds it)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole command")
}

func (o *grantorKeysAddOptions) validate(in given) error {
	var err error
	if o.org, o.keyID, err = orgAndKeyID(in.args); err != nil {
		return err
	}
	if o.pubFile == "" {
		return errors.New("--public-key-file is required")
	}
	if o.pub, err = readGrantorPublicKey(o.pubFile); err != nil {
		return fmt.Errorf("--public-key-file: %w", err)
	}
	if o.from, err = validFrom(o.validFrom, o.validUntil); err != nil {
		return err
	}
	_, err = o.db.resolve()
	return err
}

func runGrantorKeysAdd(ctx context.Context, a *app, o *grantorKeysAddOptions) int {
	return withGrantorKeysConn(ctx, a, &o.db, o.timeout, func(ctx context.Context, q sink.KeyQuerier) error {
		if err := admin.AddGrantorKey(ctx, q, sink.GrantorKey{Org: o.org, KeyID: o.keyID, PublicKey: o.pub,
			ValidFrom: o.from, ValidUntil: o.validUntil.t, Note: o.note}); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "added grantor key %s for org %s, valid from %s until %s\n", o.keyID, o.org,
			fmtTime(o.from), validUntilText(o.validUntil.t))
		return nil
	})
}

type grantorKeysRevokeOptions struct {
	db      dbConn
	timeout time.Duration

	org, keyID string
}

func (o *grantorKeysRevokeOptions) register(f *flagSet) {
	o.db.register(f)
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the whole command")
}

func (o *grantorKeysRevokeOptions) validate(in given) error {
	var err error
	if o.org, o.keyID, err = orgAndKeyID(in.args); err != nil {
		return err
	}
	_, err = o.db.resolve()
	return err
}

func runGrantorKeysRevoke(ctx context.Context, a *app, o *grantorKeysRevokeOptions) int {
	return withGrantorKeysConn(ctx, a, &o.db, o.timeout, func(ctx context.Context, q sink.KeyQuerier) error {
		if err := admin.RevokeGrantorKey(ctx, q, o.org, o.keyID, time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "revoked grantor key %s of org %s\n", o.keyID, o.org)
		return nil
	})
}

type grantorKeyView struct {
	Org        string     `json:"org"`
	KeyID      string     `json:"key_id"`
	Alg        string     `json:"alg"`
	PublicKey  string     `json:"public_key"` // PKIX PEM
	ValidFrom  time.Time  `json:"valid_from"`
	ValidUntil *time.Time `json:"valid_until,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	State      string     `json:"state"`
	Note       string     `json:"note,omitempty"`
}

func grantorKeyState(k sink.GrantorKey, now time.Time) string {
	switch {
	case !k.RevokedAt.IsZero() && !now.Before(k.RevokedAt):
		return "revoked"
	case now.Before(k.ValidFrom):
		return "not_yet_valid"
	case !k.ValidUntil.IsZero() && !now.Before(k.ValidUntil):
		return "expired"
	}
	return "valid"
}

type grantorKeysListOptions struct {
	db      dbConn
	asJSON  bool
	timeout time.Duration

	org string
}

func (o *grantorKeysListOptions) register(f *flagSet) {
	o.db.register(f)
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the query")
}

func (o *grantorKeysListOptions) validate(in given) error {
	switch len(in.args) {
	case 0:
	case 1:
		o.org = in.args[0]
		if !partitioner.ValidOrg(o.org) {
			return fmt.Errorf("org %q is outside [a-z0-9][a-z0-9-]{0,62}", o.org)
		}
	default:
		return fmt.Errorf("unexpected argument %q", in.args[1])
	}
	_, err := o.db.resolve()
	return err
}

func runGrantorKeysList(ctx context.Context, a *app, o *grantorKeysListOptions) int {
	org := o.org
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	pool, err := o.db.pool(ctx)
	if err != nil {
		a.errorf("grantor-keys list: %v", err)
		return exitFailed
	}
	defer pool.Close()
	keys, err := sink.GrantorKeys(ctx, pool, org)
	if err != nil {
		a.errorf("grantor-keys list: %v", err)
		return exitFailed
	}
	modes, err := sink.SigningModes(ctx, pool)
	if err != nil {
		a.errorf("grantor-keys list: %v", err)
		return exitFailed
	}
	now := time.Now()
	if o.asJSON {
		views := make([]grantorKeyView, 0, len(keys))
		for _, k := range keys {
			v := grantorKeyView{Org: k.Org, KeyID: k.KeyID, Alg: k.Alg, PublicKey: grantorPublicKeyPEM(k.PublicKey),
				ValidFrom: k.ValidFrom.UTC(), State: grantorKeyState(k, now), Note: k.Note}
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
		_ = enc.Encode(map[string]any{"keys": views, "grant_signing": signingModesView(modes, org)})
		return exitOK
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "ORG\tKEY ID\tSTATE\tVALID FROM\tVALID UNTIL\tREVOKED\tNOTE")
	for _, k := range keys {
		revoked := "-"
		if !k.RevokedAt.IsZero() {
			revoked = fmtTime(k.RevokedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.Org, k.KeyID, grantorKeyState(k, now), fmtTime(k.ValidFrom),
			validUntilText(k.ValidUntil), revoked, dash(k.Note))
	}
	_ = tw.Flush()
	if org != "" {
		mode, err := signingModeOf(ctx, pool, org)
		if err != nil {
			a.errorf("grantor-keys list: %v", err)
			return exitFailed
		}
		fmt.Fprintf(a.stdout, "grant_signing %s: %s\n", org, mode)
		return exitOK
	}
	orgs := make([]string, 0, len(modes))
	for o := range modes {
		orgs = append(orgs, o)
	}
	sort.Strings(orgs)
	for _, o := range orgs {
		fmt.Fprintf(a.stdout, "grant_signing %s: %s\n", o, modes[o])
	}
	return exitOK
}

func signingModesView(modes map[string]sink.SigningMode, org string) map[string]sink.SigningMode {
	out := map[string]sink.SigningMode{}
	for o, m := range modes {
		if org == "" || o == org {
			out[o] = m
		}
	}
	return out
}

func orgAndKeyID(pos []string) (string, string, error) {
	if len(pos) != 2 {
		return "", "", errors.New("want <org> <key-id>")
	}
	if !partitioner.ValidOrg(pos[0]) {
		return "", "", fmt.Errorf("org %q is outside [a-z0-9][a-z0-9-]{0,62}", pos[0])
	}
	if !partitioner.ValidID(pos[1]) {
		return "", "", fmt.Errorf("key id %q is outside [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", pos[1])
	}
	return pos[0], pos[1], nil
}

func validUntilText(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return fmtTime(t)
}

// withGrantorKeysConn runs fn on one read-write connection.
func withGrantorKeysConn(ctx context.Context, a *app, db *dbConn, timeout time.Duration, fn func(context.Context, sink.KeyQuerier) error) int {
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("%s: %v", a.path, err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := fn(ctx, conn); err != nil {
		a.errorf("%s: %v", a.path, err)
		return exitFailed
	}
	return exitOK
}

func readGrantorPublicKey(path string) (ed25519.PublicKey, error) {
	return readPEMKey[ed25519.PublicKey](path, "PUBLIC KEY", x509.ParsePKIXPublicKey)
}

func grantorPublicKeyPEM(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func readGrantorPrivateKey(path string) (ed25519.PrivateKey, error) { return cli.ReadSigningKey(path) }

// readPEMKey reads the one PEM block of type blockType in path and parses
// it into an Ed25519 key of type K.
func readPEMKey[K ed25519.PublicKey](path, blockType string, parse func([]byte) (any, error)) (K, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != blockType {
		return nil, fmt.Errorf("not a PEM %s block", blockType)
	}
	k, err := parse(block.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := k.(K)
	if !ok {
		return nil, fmt.Errorf("a %T, not an Ed25519 key", k)
	}
	return key, nil
}

// signingFlags are the flags that sign a grantor command mandatectl sends.
type signingFlags struct {
	keyFile string
	keyID   string
}

func (s *signingFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.keyFile, "signing-key-file", "", "sign the command with this grantor private key (PKCS#8 PEM)")
	fs.StringVar(&s.keyID, "signing-key-id", "", "the id the signing key is registered under (required with --signing-key-file)")
}

// signer returns the signer the flags name, nil when no key was given.
func (s *signingFlags) signer() (*client.Signer, error) {
	if s.keyFile == "" {
		if s.keyID != "" {
			return nil, errors.New("--signing-key-id needs --signing-key-file")
		}
		return nil, nil
	}
	if s.keyID == "" {
		return nil, errors.New("--signing-key-id is required with --signing-key-file")
	}
	priv, err := cli.ReadSigningKey(s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--signing-key-file: %w", err)
	}
	return &client.Signer{KeyID: s.keyID, Key: priv}, nil
}

// sign returns value signed, or value itself when no key was given.
func (s *signingFlags) sign(value []byte) ([]byte, error) {
	if s.keyFile == "" {
		if s.keyID != "" {
			return nil, errors.New("--signing-key-id needs --signing-key-file")
		}
		return value, nil
	}
	if s.keyID == "" {
		return nil, errors.New("--signing-key-id is required with --signing-key-file")
	}
	priv, err := readGrantorPrivateKey(s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--signing-key-file: %w", err)
	}
	return wire.SignCommand(value, s.keyID, priv)
}
