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

func runDecisionKeys(a *app, args []string) int {
	subs := map[string]func(*app, []string) int{
		"generate": runDecisionKeysGenerate, "add": runDecisionKeysAdd, "revoke": runDecisionKeysRevoke, "list": runDecisionKeysList,
	}
	if len(args) > 0 {
		if f, ok := subs[args[0]]; ok {
			return f(a, args[1:])
		}
	}
	fmt.Fprint(a.stderr, `usage: mandatectl decision-keys generate|add|revoke|list [flags]

Decision keys are the deployment's: mandated signs every record it publishes
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
old one as of the restart (it keeps verifying what it signed before).
`)
	return exitUsage
}

func runDecisionKeysGenerate(a *app, args []string) int {
	f := a.newFlagSet("decision-keys generate", "--private-key-file FILE",
		`Generate the deployment's Ed25519 decision key pair. The private key is
written to --private-key-file (PKCS#8 PEM, mode 0600; the file must not
exist): it is mandated's (--decision-signing-key-file), never a caller's. The
key id and the public key (PKIX PEM) are printed, for 'decision-keys add'
and for the callers that check signatures.`,
		"mandatectl decision-keys generate --private-key-file decisions-2026-12.pem > decisions-2026-12.pub.pem")
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
	if err == nil {
		err = writePrivateKey(*file, priv)
	}
	if err != nil {
		a.errorf("decision-keys generate: %v", err)
		return exitFailed
	}
	fmt.Fprintf(a.stderr, "decision key %s: private key in %s\n", wire.DecisionKeyID(pub), *file)
	fmt.Fprint(a.stdout, wire.PublicKeyPEM(pub))
	return exitOK
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

func runDecisionKeysAdd(a *app, args []string) int {
	f := a.newFlagSet("decision-keys add", "--public-key-file FILE [--valid-from T] [--valid-until T] [flags]",
		`Register a decision key of the deployment (its id is derived from the
public key). Records it signs count from --valid-from (default now). Times
are RFC 3339 or a duration from now (90m, 30d). Register a key before
mandated signs with it, so every backup taken after knows it; after a
restore, add again the keys added since the backup, with the --valid-from
they had (mandatectl decision-keys list on the live database said it).`,
		"mandatectl decision-keys add --public-key-file decisions-2026-12.pub.pem")
	var db dbConn
	db.register(f)
	pubFile := f.String("public-key-file", "", "the public key: PKIX PEM (required)")
	var validFrom, validUntil timeFlag
	f.Var(&validFrom, "valid-from", "records made from this `time` on count (default: now)")
	f.Var(&validUntil, "valid-until", "records made from this `time` on do not count (default: never)")
	note := f.String("note", "", "free text kept with the key")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the whole command")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if *pubFile == "" {
		return f.usageErr("--public-key-file is required")
	}
	b, err := os.ReadFile(*pubFile)
	if err != nil {
		return f.usageErr("--public-key-file: %v", err)
	}
	pub, err := wire.ParsePublicKeyPEM(b)
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
	return withGrantorKeysConn(a, f, &db, *timeout, "decision-keys add", func(ctx context.Context, q sink.KeyQuerier) error {
		id, err := sink.AddDecisionKey(ctx, q, pub, from, validUntil.t, *note)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "added decision key %s, valid from %s until %s\n", id, fmtTime(from), validUntilText(validUntil.t))
		return nil
	})
}

func runDecisionKeysRevoke(a *app, args []string) int {
	f := a.newFlagSet("decision-keys revoke", "<key-id> [--at T] [flags]",
		`Revoke a decision key as of --at (default now): records it signed at or
after that time do not count (a rotated key, or one that leaked); what it
signed before keeps verifying. The key stays on record.`,
		"mandatectl decision-keys revoke 3f2a9c0d1e4b5a68")
	var db dbConn
	db.register(f)
	var at timeFlag
	f.Var(&at, "at", "records made from this `time` on do not count (default: now)")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the whole command")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return f.usageErr("one key id is required")
	}
	when := at.t
	if when.IsZero() {
		when = time.Now()
	}
	return withGrantorKeysConn(a, f, &db, *timeout, "decision-keys revoke", func(ctx context.Context, q sink.KeyQuerier) error {
		if err := sink.RevokeDecisionKey(ctx, q, pos[0], when); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "revoked decision key %s as of %s\n", pos[0], fmtTime(when))
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

func runDecisionKeysList(a *app, args []string) int {
	f := a.newFlagSet("decision-keys list", "[--json] [flags]",
		`List the deployment's decision keys with their window and their state now
(valid, not_yet_valid, expired, revoked). --json gives each public key
(PKIX PEM): what a caller that checks signatures is configured with.`,
		"mandatectl decision-keys list --json")
	var db dbConn
	db.register(f)
	asJSON := f.Bool("json", false, "print JSON instead of a table")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the query")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	pool, err := db.pool(ctx)
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
	if *asJSON {
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
