package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/mandated/mandated/wire"
)

// commandSpec describes one wire command as mandatectl flags. flags
// registers the command's own flags and returns the function that builds
// the command's type-specific JSON fields from them; a missing or bad flag
// is an error naming the flag.
type commandSpec struct {
	typ         wire.CommandType
	synopsis    string
	description string
	examples    []string
	needsKey    bool // the idempotency key is required
	// basedOn: the command names the mandate version it was based on
	// (grant): signed, mandatectl reads it from PostgreSQL unless
	// --based-on-version gives it.
	basedOn bool
	flags   func(fs *flag.FlagSet) func(set map[string]bool) (map[string]any, error)
}

func required(set map[string]bool, names ...string) error {
	for _, n := range names {
		if !set[n] {
			return fmt.Errorf("--%s is required", n)
		}
	}
	return nil
}

func wholeSeconds(name string, d time.Duration) (int64, error) {
	if d%time.Second != 0 {
		return 0, fmt.Errorf("--%s must be whole seconds, not %s", name, d)
	}
	return int64(d / time.Second), nil
}

var specGrant = commandSpec{
	typ:      wire.CmdGrant,
	basedOn:  true,
	synopsis: "--org ORG --mandate ID --operation OP --max-amount N --currency CCY [flags]",
	description: `Create a mandate, or replace the terms of an active one, on the grants topic.
Amounts are integer minor units of the currency (15000 EUR is 150.00 EUR).
Times are RFC 3339 or a duration from now (90m, 7d). --key makes a retried
grant a replay instead of a second grant.

--based-on-version names the mandate version the new terms replace (0: the
grant creates the mandate): the grant is refused stale_grant if the terms
changed since. A signed grant always names one, so that its bytes, replayed
later, cannot restore its terms: without --based-on-version mandatectl reads
the mandate's current version from PostgreSQL (--database-url or
--shard-map; 0 if there is no such mandate), or, with no database given,
signs it as the grant that creates the mandate.`,
	examples: []string{
		"mandatectl grant --org acme --mandate case-1842 --key grant-case-1842-v1 \\\n    --operation refund --max-amount 20000 --currency EUR --uses 1 \\\n    --target customer-991 --valid-until 7d --hold 5m",
		"mandatectl grant --org acme --mandate travel-q4 --operation booking.flight,booking.hotel \\\n    --max-amount 150000 --total-limit 500000 --currency EUR --uses 10 --release-on-cancel=false",
	},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		uses := fs.Int64("uses", 1, "uses allowed in total")
		maxAmount := fs.Int64("max-amount", 0, "cap per use, in minor units (required)")
		currency := fs.String("currency", "", "ISO 4217 currency code, upper case (required)")
		totalLimit := fs.Int64("total-limit", 0, "cap on the sum of held and spent amounts, in minor units (0: none)")
		var ops, targets listFlag
		fs.Var(&ops, "operation", "an `operation` the mandate covers; repeat or comma-separate (required)")
		fs.Var(&targets, "target", "an allowed `target`; repeat or comma-separate (none: any target)")
		var validFrom, validUntil timeFlag
		fs.Var(&validFrom, "valid-from", "start of validity, a `time`: RFC 3339 or a duration from now (default: now)")
		fs.Var(&validUntil, "valid-until", "end of validity, a `time`: RFC 3339 or a duration from now, e.g. 7d (default: none)")
		release := fs.Bool("release-on-cancel", true, "a cancelled authorization gives its use back")
		var hold, execTimeout durationFlag
		fs.Var(&hold, "hold", "how long (a `duration`) a reservation holds its use before it expires (default: mandated's, 5m)")
		fs.Var(&execTimeout, "execution-timeout", "how long (a `duration`) an executing authorization may run before it goes in doubt (default: mandated's, 1h)")
		basedOn := fs.Int64("based-on-version", 0, "the mandate `version` these terms replace (0: the grant creates the mandate); a newer one answers stale_grant")
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "max-amount", "currency", "operation"); err != nil {
				return nil, err
			}
			body := map[string]any{
				"uses":              *uses,
				"max_amount":        map[string]any{"minor_units": *maxAmount, "currency": *currency},
				"operations":        []string(ops),
				"release_on_cancel": *release,
			}
			if set["total-limit"] {
				body["total_limit"] = map[string]any{"minor_units": *totalLimit, "currency": *currency}
			}
			if len(targets) > 0 {
				body["targets"] = []string(targets)
			}
			if validFrom.set {
				body["valid_from"] = validFrom.String()
			}
			if validUntil.set {
				body["valid_until"] = validUntil.String()
			}
			if set["hold"] {
				s, err := wholeSeconds("hold", hold.d)
				if err != nil {
					return nil, err
				}
				body["hold_seconds"] = s
			}
			if set["execution-timeout"] {
				s, err := wholeSeconds("execution-timeout", execTimeout.d)
				if err != nil {
					return nil, err
				}
				body["execution_timeout_seconds"] = s
			}
			if set["based-on-version"] {
				if *basedOn < 0 {
					return nil, fmt.Errorf("--based-on-version must be 0 or more")
				}
				body["based_on_version"] = *basedOn
			}
			return body, nil
		}
	},
}

var specRevoke = commandSpec{
	typ:      wire.CmdRevoke,
	synopsis: "--org ORG --mandate ID [--reason TEXT] [flags]",
	description: `Revoke a mandate on the grants topic: its unused authority ends and its
reserved authorizations are revoked; executing and in-doubt ones must still
finish.`,
	examples: []string{`mandatectl revoke --org acme --mandate case-1842 --key revoke-case-1842 --reason "case closed"`},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		reason := fs.String("reason", "", "why, for the audit trail")
		return func(map[string]bool) (map[string]any, error) {
			body := map[string]any{}
			if *reason != "" {
				body["reason"] = *reason
			}
			return body, nil
		}
	},
}

var specPropose = commandSpec{
	typ:      wire.CmdPropose,
	needsKey: true,
	synopsis: "--org ORG --mandate ID --key KEY --operation OP --amount N --currency CCY --target T [flags]",
	description: `Ask for one use of a mandate. The decision is reserved (with the new
authorization's id, needed by begin, commit and cancel) or says why not.
--key is the idempotency key of the business intent: sending the same intent
again on this mandate is answered with the original authorization
(replayed). A key is scoped by the mandate and the operation: on another
mandate it is another intent.
--run-id, --step and --action name the intent by the workflow's facts: the
same intent on this mandate is answered replayed (intent_replayed) whatever
the key, and a new use for it takes --fork-of naming its terminal latest
authorization.
The amount is in integer minor units (15000 EUR is 150.00 EUR).`,
	examples: []string{
		"mandatectl propose --org acme --mandate case-1842 --key refund-1 --operation refund \\\n    --amount 15000 --currency EUR --target customer-991",
		"mandatectl propose --org acme --mandate case-1842 --key refund-1 --operation refund \\\n    --amount 15000 --currency EUR --target customer-991 --deadline 2m --json",
		"mandatectl propose --org acme --mandate case-1842 --key refund-2 --operation refund \\\n    --amount 15000 --currency EUR --target customer-991 \\\n    --run-id run-5521 --step refund --action refund:customer-991 --fork-of au_...",
	},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		operation := fs.String("operation", "", "the operation (required)")
		amount := fs.Int64("amount", 0, "amount in minor units (required)")
		currency := fs.String("currency", "", "ISO 4217 currency code, upper case (required)")
		target := fs.String("target", "", "who or what the operation is for (required)")
		basedOn := fs.Int64("based-on-version", 0, "the mandate version the agent saw (a newer one answers stale_version)")
		var deadline timeFlag
		fs.Var(&deadline, "deadline", "requested reservation deadline, a `time`: RFC 3339 or a duration from now (default: the mandate's hold window)")
		intent := intentFlags(fs)
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "operation", "amount", "currency", "target"); err != nil {
				return nil, err
			}
			body := map[string]any{
				"operation": *operation,
				"amount":    map[string]any{"minor_units": *amount, "currency": *currency},
				"target":    *target,
			}
			if set["based-on-version"] {
				body["based_on_version"] = *basedOn
			}
			if deadline.set {
				body["deadline"] = deadline.String()
			}
			if err := intent(set, body); err != nil {
				return nil, err
			}
			return body, nil
		}
	},
}

func authorizationFlag(fs *flag.FlagSet) *string {
	return fs.String("authorization", "", "the authorization id, from the propose decision (required)")
}

// executionTokenFlag is the token a winning begin handed out.
func executionTokenFlag(fs *flag.FlagSet, what string) *int64 {
	return fs.Int64("execution-token", 0, "the execution token of the begin this "+what+" follows (from its executing decision)")
}

func withToken(body map[string]any, set map[string]bool, token int64) map[string]any {
	if set["execution-token"] {
		body["execution_token"] = token
	}
	return body
}

var specBegin = commandSpec{
	typ:      wire.CmdBegin,
	synopsis: "--org ORG --mandate ID --authorization AU [--executor ID] [flags]",
	description: `Move a reserved authorization to executing: the compare-and-set gate to pass
before the external call. Refused after the reservation's deadline. The first
executor wins and gets an execution token (carry it on commit, cancel and
report-unknown); the same --executor again is a replay; any other executor is
refused already_executing and told the winner. Without --executor (and
without --key) this invocation is one new attempt named after the host, the
process and the time.`,
	examples: []string{"mandatectl begin --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r --executor worker-7:attempt-1"},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		auth := authorizationFlag(fs)
		executor := fs.String("executor", "", "this execution attempt's id (worker instance + attempt nonce); the same id again is a replay")
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "authorization"); err != nil {
				return nil, err
			}
			body := map[string]any{"authorization_id": *auth}
			switch {
			case *executor != "":
				body["executor"] = *executor
			case !set["key"]:
				host, _ := os.Hostname()
				body["executor"] = fmt.Sprintf("mandatectl:%s:%d:%d", sanitizeID(host), os.Getpid(), time.Now().UnixNano())
			}
			return body, nil
		}
	},
}

// sanitizeID keeps the characters of the id grammar.
func sanitizeID(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "host"
	}
	return string(b[:min(len(b), 64)])
}

var specCommit = commandSpec{
	typ:      wire.CmdCommit,
	synopsis: "--org ORG --mandate ID --authorization AU --external-ref REF [flags]",
	description: `Record that the external call happened, with the provider's reference (and
optionally its result, a JSON object of at most 8 KiB, returned to every later
caller). This consumes the use. After a begin it needs that begin's
--execution-token; straight from reserved (nobody began) it carries none.`,
	examples: []string{"mandatectl commit --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r \\\n    --execution-token 1 --external-ref re_3PqX9a2eZvKYlo2C1xQ --result '{\"status\":\"succeeded\"}'"},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		auth := authorizationFlag(fs)
		ref := fs.String("external-ref", "", "the provider's reference for the executed call (required)")
		token := executionTokenFlag(fs, "commit")
		result := fs.String("result", "", "the provider's answer, a JSON object")
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "authorization", "external-ref"); err != nil {
				return nil, err
			}
			body := map[string]any{"authorization_id": *auth, "external_ref": *ref}
			if set["result"] {
				body["result"] = json.RawMessage(*result)
				if !json.Valid([]byte(*result)) {
					return nil, fmt.Errorf("--result is not JSON")
				}
			}
			return withToken(body, set, *token), nil
		}
	},
}

var specCancel = commandSpec{
	typ:      wire.CmdCancel,
	synopsis: "--org ORG --mandate ID --authorization AU [--reason TEXT] [--not-executed-proof TEXT] [flags]",
	description: `Give up an authorization. A reserved one is cancelled; an executing one only
with proof that the external call did not happen (--not-executed-proof).`,
	examples: []string{
		`mandatectl cancel --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r --reason "customer withdrew"`,
		`mandatectl cancel --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r \` + "\n" +
			`    --not-executed-proof "provider returned 404 for idempotency key refund-1"`,
	},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		auth := authorizationFlag(fs)
		reason := fs.String("reason", "", "why")
		proof := fs.String("not-executed-proof", "", "evidence that the external call did not happen (required to cancel an executing authorization)")
		token := executionTokenFlag(fs, "cancel")
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "authorization"); err != nil {
				return nil, err
			}
			body := map[string]any{"authorization_id": *auth}
			if *reason != "" {
				body["reason"] = *reason
			}
			if *proof != "" {
				body["not_executed_proof"] = *proof
			}
			return withToken(body, set, *token), nil
		}
	},
}

var specReportUnknown = commandSpec{
	typ:      wire.CmdReportUnknown,
	synopsis: "--org ORG --mandate ID --authorization AU [--detail TEXT] [flags]",
	description: `Say that an executing authorization's external outcome is unknown (a timeout,
a lost response). It goes in doubt and keeps its use until resolve. The
decision's outcome is in_doubt, so this command exits 1 when it succeeds.`,
	examples: []string{`mandatectl report-unknown --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r \` + "\n" +
		`    --detail "provider timed out after 30 s"`},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		auth := authorizationFlag(fs)
		detail := fs.String("detail", "", "what is known")
		token := executionTokenFlag(fs, "report")
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "authorization"); err != nil {
				return nil, err
			}
			body := map[string]any{"authorization_id": *auth}
			if *detail != "" {
				body["detail"] = *detail
			}
			return withToken(body, set, *token), nil
		}
	},
}

var specResolve = commandSpec{
	typ:      wire.CmdResolve,
	synopsis: "--org ORG --mandate ID --authorization AU --outcome committed|cancelled [flags]",
	description: `Settle an in-doubt authorization after reconciling with the provider:
committed (with the provider's --external-ref) or cancelled. Sent on the grants
topic (the reconciler is part of the privileged control plane). With
--execution-token it names the execution it decided about, and is refused if
that is not the authorization's. 'mandatectl reconcile' lists what needs
resolving and sends this for you.`,
	examples: []string{
		`mandatectl resolve --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r \` + "\n" +
			`    --outcome committed --external-ref re_3PqX9a2eZvKYlo2C1xQ --evidence "provider lists the refund"`,
		`mandatectl resolve --org acme --mandate case-1842 --authorization au_jd4myjhey7qd2migc457x36r --outcome cancelled`,
	},
	flags: func(fs *flag.FlagSet) func(map[string]bool) (map[string]any, error) {
		auth := authorizationFlag(fs)
		outcome := fs.String("outcome", "", "committed or cancelled (required)")
		ref := fs.String("external-ref", "", "the provider's reference (required with --outcome committed)")
		evidence := fs.String("evidence", "", "what the reconciliation found")
		token := executionTokenFlag(fs, "resolve")
		return func(set map[string]bool) (map[string]any, error) {
			if err := required(set, "authorization", "outcome"); err != nil {
				return nil, err
			}
			switch wire.ResolveOutcome(*outcome) {
			case wire.ResolveCommitted:
				if *ref == "" {
					return nil, fmt.Errorf("--external-ref is required with --outcome committed")
				}
			case wire.ResolveCancelled:
			default:
				return nil, fmt.Errorf("--outcome must be committed or cancelled, not %q", *outcome)
			}
			body := map[string]any{"authorization_id": *auth, "outcome": *outcome}
			if *ref != "" {
				body["external_ref"] = *ref
			}
			if *evidence != "" {
				body["evidence"] = *evidence
			}
			return withToken(body, set, *token), nil
		}
	},
}
