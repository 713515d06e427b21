package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/gateway"
)

func tokensCommand() *command {
	return group(&command{
		name:    "tokens",
		group:   groupSetup,
		summary: "create, revoke or list the HTTP gateway's per-org bearer tokens",
		usage:   "create|revoke|list [flags]",
		description: `  create <org> [--name N]   create a bearer token of the HTTP gateway for one org;
                            the token is printed once and only its hash is stored
  create --operator [--name N]
                            create an operator token of the gateway's console (/console)
  revoke <token-id>         revoke a token (the gateway refuses it at once)
  list [--org O] [--json]   list tokens (ids, kinds, orgs, names, never secrets)

An API token acts for its org only, and only as an agent or platform
(propose, begin, commit, cancel, report-unknown, status); grants, revokes and
resolves are never taken over its API. An operator token opens the console
only (every org's in-doubt executions, mandates, partitions, the last verify,
and reconciling): the API refuses it, and the console refuses API tokens.
Run 'mandatectl tokens create --help'.

Examples:
  mandatectl tokens create acme --name refund-agent
  mandatectl tokens create --operator --name on-call
  mandatectl tokens list --org acme
  mandatectl tokens revoke gt_abcdefghijklmnop`,
	},
		leaf(&command{
			name:    "create",
			summary: "create an org's API token, or with --operator a console token; printed once",
			usage:   "<org> | --operator [--name N] [--json] [flags]",
			description: `Create a bearer token of the HTTP gateway for <org>, or with --operator an
operator token of its console (/console), and print it once. Only its
SHA-256 is stored; a lost token cannot be shown again: revoke it and create
another.`,
			examples: []string{
				"mandatectl tokens create acme --name refund-agent",
				"mandatectl tokens create --operator --name on-call",
			},
		}, runTokensCreate),
		leaf(&command{
			name:    "revoke",
			summary: "revoke a token (the gateway refuses it at once)",
			usage:   "<token-id> [flags]",
			description: `Revoke a gateway token by its id (an API token's gt_..., an operator
token's ot_...). The gateway refuses it from the next request on.`,
			examples: []string{"mandatectl tokens revoke gt_abcdefghijklmnop"},
		}, runTokensRevoke),
		leaf(&command{
			name:        "list",
			summary:     "list tokens (ids, kinds, orgs, names, never secrets)",
			usage:       "[--org O] [--json] [flags]",
			description: `List gateway tokens: ids, kinds (api, operator), orgs, names, when created and revoked; operator tokens without --org.`,
			examples:    []string{"mandatectl tokens list --org acme"},
		}, runTokensList),
	)
}

type tokensCreateOptions struct {
	db       dbConn
	name     string
	operator bool
	asJSON   bool

	org string
}

func (o *tokensCreateOptions) register(f *flagSet) {
	o.db.register(f)
	f.StringVar(&o.name, "name", "", "what the token is for (shown by list)")
	f.BoolVar(&o.operator, "operator", false, "an operator token of the console (no org: it acts for the deployment) instead of an org's API token")
	f.BoolVar(&o.asJSON, "json", false, "print JSON ({token_id, kind, org, name, token})")
}

func (o *tokensCreateOptions) validate(in given) error {
	switch {
	case o.operator && len(in.args) != 0:
		return errors.New("an operator token belongs to no org: give no org with --operator")
	case !o.operator && len(in.args) != 1:
		return errors.New("give exactly one org (or --operator)")
	}
	if !o.operator {
		o.org = in.args[0]
	}
	_, err := o.db.resolve()
	return err
}

func runTokensCreate(ctx context.Context, a *app, o *tokensCreateOptions) int {
	return withDB(ctx, a, &o.db, func(ctx context.Context, conn gateway.Execer) int {
		var t gateway.Token
		var secret string
		var err error
		if o.operator {
			t, secret, err = gateway.CreateOperatorToken(ctx, conn, o.name)
		} else {
			t, secret, err = gateway.CreateToken(ctx, conn, o.org, o.name)
		}
		if err != nil {
			a.errorf("tokens create: %v", err)
			return exitFailed
		}
		if o.asJSON {
			_ = json.NewEncoder(a.stdout).Encode(map[string]string{"token_id": t.ID, "kind": t.Kind, "org": t.Org, "name": t.Name, "token": secret})
			return exitOK
		}
		if o.operator {
			fmt.Fprintf(a.stdout, "operator token %s for the console (shown once; store it as a secret):\n%s\n", t.ID, secret)
			return exitOK
		}
		fmt.Fprintf(a.stdout, "token %s for org %s (shown once; store it as a secret):\n%s\n", t.ID, t.Org, secret)
		return exitOK
	})
}

type tokensRevokeOptions struct {
	db dbConn

	id string
}

func (o *tokensRevokeOptions) register(f *flagSet) { o.db.register(f) }

func (o *tokensRevokeOptions) validate(in given) error {
	if len(in.args) != 1 {
		return errors.New("give exactly one token id")
	}
	o.id = in.args[0]
	_, err := o.db.resolve()
	return err
}

func runTokensRevoke(ctx context.Context, a *app, o *tokensRevokeOptions) int {
	return withDB(ctx, a, &o.db, func(ctx context.Context, conn gateway.Execer) int {
		err := gateway.RevokeToken(ctx, conn, o.id)
		if errors.Is(err, gateway.ErrTokenNotFound) {
			a.errorf("tokens revoke: no token %s", o.id)
			return exitFailed
		}
		if err != nil {
			a.errorf("tokens revoke: %v", err)
			return exitFailed
		}
		fmt.Fprintf(a.stdout, "revoked %s\n", o.id)
		return exitOK
	})
}

type tokensListOptions struct {
	db     dbConn
	org    string
	asJSON bool
}

func (o *tokensListOptions) register(f *flagSet) {
	o.db.register(f)
	f.StringVar(&o.org, "org", "", "only this org's tokens")
	f.BoolVar(&o.asJSON, "json", false, "print JSON")
}

func (o *tokensListOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	_, err := o.db.resolve()
	return err
}

func runTokensList(ctx context.Context, a *app, o *tokensListOptions) int {
	return withDB(ctx, a, &o.db, func(ctx context.Context, conn gateway.Execer) int {
		ts, err := gateway.ListTokens(ctx, conn, o.org)
		if err != nil {
			a.errorf("tokens list: %v", err)
			return exitFailed
		}
		if o.asJSON {
			enc := json.NewEncoder(a.stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(ts)
			return exitOK
		}
		tw := newTable(a.stdout)
		fmt.Fprintln(tw, "TOKEN\tKIND\tORG\tNAME\tCREATED\tREVOKED")
		for _, t := range ts {
			revoked := "-"
			if t.RevokedAt != nil {
				revoked = fmtTime(*t.RevokedAt)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Kind, dash(t.Org), dash(t.Name), fmtTime(t.CreatedAt), revoked)
		}
		_ = tw.Flush()
		return exitOK
	})
}

// withDB runs fn on one read-write connection (tokens are written here and
// only read by the gateway).
func withDB(ctx context.Context, a *app, db *dbConn, fn func(context.Context, gateway.Execer) int) int {
	ctx, cancel := withTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("%s: %v", a.path, err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}
