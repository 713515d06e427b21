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

func runGrantorKeys(a *app, args []string) int {
	subs := map[string]func(*app, []string) int{
		"generate": runGrantorKeysGenerate, "add": runGrantorKeysAdd, "revoke": runGrantorKeysRevoke,
		"list": runGrantorKeysList, "require": runSigningRequire, "relax": runSigningRelax,
	}
	if len(args) > 0 {
		if f, ok := subs[args[0]]; ok {
			return f(a, args[1:])
		}
	}
	fmt.Fprint(a.stderr, `usage: mandatectl grantor-keys generate|add|revoke|list|require|relax [flags]

Grantor keys sign grant, revoke and resolve commands (Ed25519). mandated
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
key is usable at once.
`)
	return exitUsage
}

func runGrantorKeysGenerate(a *app, args []string) int {
	f := a.newFlagSet("grantor-keys generate", "--private-key-file FILE",
		`Generate an Ed25519 key pair for a grantor. The private key is written to
--private-key-file (PKCS#8 PEM, mode 0600; the file must not exist); the
public key is printed (PKIX PEM) for 'mandatectl grantor-keys add'. The
private key belongs to the grantor, never to mandated.`,
		"mandatectl grantor-keys generate --private-key-file grantor-2026-11.pem > grantor-2026-11.pub.pem")
	file := f.String("private-key-file", "", "where to write the private key (required)")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if *file == "" {
		return f.usageErr("--private-key-file is required")
	}
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		a.errorf("grantor-keys generate: %v", err)
		return exitFailed
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		a.errorf("grantor-keys generate: %v", err)
		return exitFailed
	}
	out, err := os.OpenFile(*file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		a.errorf("grantor-keys generate: %v", err)
		return exitFailed
	}
	if err := errors.Join(pem.Encode(out, &pem.Block{Type: "PRIVATE KEY", Bytes: der}), out.Close()); err != nil {
		a.errorf("grantor-keys generate: %v", err)
		return exitFailed
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		a.errorf("grantor-keys generate: %v", err)
		return exitFailed
	}
	_ = pem.Encode(a.stdout, &pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return exitOK
}

func runGrantorKeysAdd(a *app, args []string) int {
	f := a.newFlagSet("grantor-keys add", "<org> <key-id> --public-key-file FILE [--valid-from T] [--valid-until T] [flags]",
		`Register a grantor's public key for an org. Key ids are never reused
within an org, so a decision's signed_by names one key forever. Times are
RFC 3339 or a duration from now (90m, 30d).`,
		"mandatectl grantor-keys add acme grantor-2026-11 --public-key-file grantor-2026-11.pub.pem --valid-until 400d")
	var db dbConn
	db.register(f)
	pubFile := f.String("public-key-file", "", "the public key: PKIX PEM (openssl pkey -pubout) (required)")
	var validFrom, validUntil timeFlag
	f.Var(&validFrom, "valid-from", "the key signs from this `time` on (default: now)")
	f.Var(&validUntil, "valid-until", "the key stops signing at this `time` (default: never)")
	note := f.String("note", "", "free text kept with the key (who holds it)")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the whole command")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	org, keyID, err := orgAndKeyID(pos)
	if err != nil {
		return f.usageErr("%v", err)
	}
	if *pubFile == "" {
		return f.usageErr("--public-key-file is required")
	}
	pub, err := readGrantorPublicKey(*pubFile)
	if err != nil {
		return f.usageErr("--public-key-file: %v", err)
	}
	from := validFrom.t
	if from.IsZero() {
		from = time.Now()
	}
	if !validUntil.t.IsZero() && !validUntil.t.After(from) {
		return f.usageErr("--valid-until must be after --valid-from")
	}
	return withGrantorKeysConn(a, f, &db, *timeout, "grantor-keys add", func(ctx context.Context, q sink.KeyQuerier) error {
		if err := admin.AddGrantorKey(ctx, q, sink.GrantorKey{Org: org, KeyID: keyID, PublicKey: pub,
			ValidFrom: from, ValidUntil: validUntil.t, Note: *note}); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "added grantor key %s for org %s, valid from %s until %s\n", keyID, org,
			fmtTime(from), validUntilText(validUntil.t))
		return nil
	})
}

func runGrantorKeysRevoke(a *app, args []string) int {
	f := a.newFlagSet("grantor-keys revoke", "<org> <key-id> [flags]",
		`Revoke a grantor key now: commands it signs are rejected
(signature_key_revoked) once processors refresh their keys (within
--grantor-key-refresh). The key stays on record for the decisions it signed.`,
		"mandatectl grantor-keys revoke acme grantor-2026-11")
	var db dbConn
	db.register(f)
	timeout := f.Duration("timeout", 30*time.Second, "bound on the whole command")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	org, keyID, err := orgAndKeyID(pos)
	if err != nil {
		return f.usageErr("%v", err)
	}
	return withGrantorKeysConn(a, f, &db, *timeout, "grantor-keys revoke", func(ctx context.Context, q sink.KeyQuerier) error {
		if err := admin.RevokeGrantorKey(ctx, q, org, keyID, time.Now()); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "revoked grantor key %s of org %s\n", keyID, org)
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

func runGrantorKeysList(a *app, args []string) int {
	f := a.newFlagSet("grantor-keys list", "[<org>] [--json] [flags]",
		`List grantor keys (of one org, or all) with their validity window, their
state now (valid, not_yet_valid, expired, revoked) and each org's
grant_signing setting.`,
		"mandatectl grantor-keys list acme")
	var db dbConn
	db.register(f)
	asJSON := f.Bool("json", false, "print JSON instead of a table")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the query")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	org := ""
	switch len(pos) {
	case 0:
	case 1:
		org = pos[0]
		if !partitioner.ValidOrg(org) {
			return f.usageErr("org %q is outside [a-z0-9][a-z0-9-]{0,62}", org)
		}
	default:
		return f.usageErr("unexpected argument %q", pos[1])
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	pool, err := db.pool(ctx)
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
	if *asJSON {
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
func withGrantorKeysConn(a *app, f *flagSet, db *dbConn, timeout time.Duration, name string, fn func(context.Context, sink.KeyQuerier) error) int {
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, timeout)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("%s: %v", name, err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := fn(ctx, conn); err != nil {
		a.errorf("%s: %v", name, err)
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
