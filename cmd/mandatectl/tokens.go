package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/gateway"
)

const tokensUsage = `usage: mandatectl tokens create|revoke|list [flags]

  create <org> [--name N]   create a bearer token of the HTTP gateway for one org;
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
  mandatectl tokens revoke gt_abcdefghijklmnop
`

func runTokens(a *app, args []string) int {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "create":
		return runTokensCreate(a, args)
	case "revoke":
		return runTokensRevoke(a, args)
	case "list":
		return runTokensList(a, args)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(a.stdout, tokensUsage)
		return exitOK
	}
	fmt.Fprint(a.stderr, tokensUsage)
	return exitUsage
}

func runTokensCreate(a *app, args []string) int {
	f := a.newFlagSet("tokens create", "<org> | --operator [--name N] [--json] [flags]",
		`Create a bearer token of the HTTP gateway for <org>, or with --operator an
operator token of its console (/console), and print it once. Only its
SHA-256 is stored; a lost token cannot be shown again: revoke it and create
another.`,
		"mandatectl tokens create acme --name refund-agent",
		"mandatectl tokens create --operator --name on-call")
	var db dbConn
	db.register(f)
	name := f.String("name", "", "what the token is for (shown by list)")
	operator := f.Bool("operator", false, "an operator token of the console (no org: it acts for the deployment) instead of an org's API token")
	asJSON := f.Bool("json", false, "print JSON ({token_id, kind, org, name, token})")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	switch {
	case *operator && len(pos) != 0:
		return f.usageErr("an operator token belongs to no org: give no org with --operator")
	case !*operator && len(pos) != 1:
		return f.usageErr("give exactly one org (or --operator)")
	}
	return withDB(a, f, &db, func(ctx context.Context, conn gateway.Execer) int {
		var t gateway.Token
		var secret string
		var err error
		if *operator {
			t, secret, err = gateway.CreateOperatorToken(ctx, conn, *name)
		} else {
			t, secret, err = gateway.CreateToken(ctx, conn, pos[0], *name)
		}
		if err != nil {
			a.errorf("tokens create: %v", err)
			return exitFailed
		}
		if *asJSON {
			_ = json.NewEncoder(a.stdout).Encode(map[string]string{"token_id": t.ID, "kind": t.Kind, "org": t.Org, "name": t.Name, "token": secret})
			return exitOK
		}
		if *operator {
			fmt.Fprintf(a.stdout, "operator token %s for the console (shown once; store it as a secret):\n%s\n", t.ID, secret)
			return exitOK
		}
		fmt.Fprintf(a.stdout, "token %s for org %s (shown once; store it as a secret):\n%s\n", t.ID, t.Org, secret)
		return exitOK
	})
}

func runTokensRevoke(a *app, args []string) int {
	f := a.newFlagSet("tokens revoke", "<token-id> [flags]",
		`Revoke a gateway token by its id (an API token's gt_..., an operator
token's ot_...). The gateway refuses it from the next request on.`,
		"mandatectl tokens revoke gt_abcdefghijklmnop")
	var db dbConn
	db.register(f)
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		return f.usageErr("give exactly one token id")
	}
	return withDB(a, f, &db, func(ctx context.Context, conn gateway.Execer) int {
		err := gateway.RevokeToken(ctx, conn, pos[0])
		if errors.Is(err, gateway.ErrTokenNotFound) {
			a.errorf("tokens revoke: no token %s", pos[0])
			return exitFailed
		}
		if err != nil {
			a.errorf("tokens revoke: %v", err)
			return exitFailed
		}
		fmt.Fprintf(a.stdout, "revoked %s\n", pos[0])
		return exitOK
	})
}

func runTokensList(a *app, args []string) int {
	f := a.newFlagSet("tokens list", "[--org O] [--json] [flags]", `List gateway tokens: ids, kinds (api, operator), orgs, names, when created and revoked; operator tokens without --org.`,
		"mandatectl tokens list --org acme")
	var db dbConn
	db.register(f)
	org := f.String("org", "", "only this org's tokens")
	asJSON := f.Bool("json", false, "print JSON")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	return withDB(a, f, &db, func(ctx context.Context, conn gateway.Execer) int {
		ts, err := gateway.ListTokens(ctx, conn, *org)
		if err != nil {
			a.errorf("tokens list: %v", err)
			return exitFailed
		}
		if *asJSON {
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
func withDB(a *app, f *flagSet, db *dbConn, fn func(context.Context, gateway.Execer) int) int {
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, 30*time.Second)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("%s: %v", f.name, err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}
