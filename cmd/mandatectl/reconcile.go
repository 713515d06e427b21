package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// reconcileView is one in-doubt authorization as reconcile lists it.
type reconcileView struct {
	inDoubtView
	Executor       string `json:"executor,omitempty"`
	ExecutionToken int64  `json:"execution_token,omitempty"`
}

func reconcileCommand() *command {
	return leaf(&command{
		name:    "reconcile",
		group:   groupOps,
		summary: "list in-doubt executions with their tokens; resolve one on the operator's decision",
		usage:   "[--older-than D] [--org ORG] [--json] | --mandate ORG/ID --authorization AU (--committed REF [--result JSON | --result-file F] | --cancelled) [--evidence TEXT] [flags]",
		description: `The reconciler's tool. Without a decision it lists in-doubt authorizations
older than --older-than with what the provider needs to be asked: the
authorization id (the provider's idempotency key), the execution token, the
executor whose begin won and the external reference if one was reported.

With --committed REF or --cancelled it sends that decision as 'resolve' on the
grants topic (the privileged control plane), naming the execution token of
the in-doubt execution (or --execution-token, the execution the operator
checked), and waits for mandated's decision: a stale token is refused and
changes nothing. --reconciler (default mandatectl:$USER) is recorded with
the authorization as who resolved it, beside the evidence and what was
reported when it went in doubt. With --committed, --result (or --result-file) is the
provider's answer, a JSON object: it becomes the authorization's recorded
result, which the execution's losers and every later begin are shown (as a
winner's commit records it). Where the org requires signed grantor commands
(grant_signing required), sign it with --signing-key-file and
--signing-key-id, a key registered for the org ('mandatectl grantor-keys').
It exits 0 when the authorization was resolved (or already was, the same
way), 1 when it was refused, 2 on bad usage (or a resolve mandated
rejected, such as an unsigned one where signing is required), 3 when no
decision came within --timeout.`,
		examples: []string{
			"mandatectl reconcile --older-than 15m",
			"mandatectl reconcile --mandate acme/case-1842 --authorization au_jd4myjhey7qd2migc457x36r \\\n    --committed re_3PqX9a2eZvKYlo2C1xQ --evidence \"provider lists the refund\"",
			"mandatectl reconcile --mandate acme/case-1842 --authorization au_jd4myjhey7qd2migc457x36r \\\n    --committed re_3PqX9a2eZvKYlo2C1xQ --result-file refund.json --evidence \"GET /v1/refunds/re_3PqX9a2eZvKYlo2C1xQ\"",
			"mandatectl reconcile --mandate acme/case-1842 --authorization au_jd4myjhey7qd2migc457x36r --cancelled \\\n    --evidence \"provider: no such refund; idempotency key voided\"",
			"mandatectl reconcile --mandate acme/case-1842 --authorization au_jd4myjhey7qd2migc457x36r --committed re_3PqX9a2eZvKYlo2C1xQ \\\n    --signing-key-file reconciler.pem --signing-key-id reconciler-2026",
		},
	}, runReconcile)
}

type reconcileOptions struct {
	db         dbConn
	kc         kafkaConn
	topics     topicNames
	olderThan  durationFlag
	org        string
	limit      int
	asJSON     bool
	mandate    string
	auth       string
	committed  string
	cancelled  bool
	evidence   string
	resultJSON string
	resultFile string
	reconciler string
	token      int64
	timeout    time.Duration
	signing    signingFlags

	deciding bool
	result   json.RawMessage
	key      partitioner.MandateKey
}

func (o *reconcileOptions) register(f *flagSet) {
	o.db.register(f)
	o.kc.register(f)
	o.topics.register(f)
	f.Var(&o.olderThan, "older-than", "list those in doubt for at least this `duration` (e.g. 10m, 2h, 1d)")
	f.StringVar(&o.org, "org", "", "list only this org")
	f.IntVar(&o.limit, "limit", 1000, "list at most this many")
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	f.StringVar(&o.mandate, "mandate", "", "the mandate, <org>/<mandate_id> (with a decision)")
	f.StringVar(&o.auth, "authorization", "", "the in-doubt authorization (with a decision)")
	f.StringVar(&o.committed, "committed", "", "the provider executed it: its external `reference`")
	f.BoolVar(&o.cancelled, "cancelled", false, "the provider did not execute it (and will not: void the idempotency key first)")
	f.StringVar(&o.evidence, "evidence", "", "what the provider said (recorded with the decision)")
	f.StringVar(&o.resultJSON, "result", "", "with --committed: the provider's answer, a JSON `object` (recorded as the authorization's result)")
	f.StringVar(&o.resultFile, "result-file", "", "with --committed: read the provider's answer (a JSON object) from this `file`")
	f.StringVar(&o.reconciler, "reconciler", defaultReconciler(), "who resolves it, an `id` recorded with the authorization as resolved_by")
	f.docDefault("reconciler", "mandatectl:$USER")
	f.Int64Var(&o.token, "execution-token", 0, "the execution the decision is about (default: the in-doubt execution's token)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the query, and on waiting for the decision")
	o.signing.register(f.FlagSet)
}

func (o *reconcileOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if _, err := o.db.resolve(); err != nil {
		return err
	}
	o.deciding = o.committed != "" || o.cancelled
	if !o.deciding {
		switch {
		case o.mandate != "" || o.auth != "":
			return errors.New("--mandate and --authorization need a decision: --committed REF or --cancelled")
		case o.org != "" && !partitioner.ValidOrg(o.org):
			return fmt.Errorf("--org %q is not a valid org", o.org)
		case o.limit < 1:
			return errors.New("--limit must be at least 1")
		case o.signing.keyFile != "" || o.signing.keyID != "":
			return errors.New("--signing-key-file and --signing-key-id sign a decision: --committed REF or --cancelled")
		}
		return nil
	}
	if o.committed != "" && o.cancelled {
		return errors.New("--committed and --cancelled exclude each other")
	}
	var err error
	if o.result, err = readResult(o.resultJSON, o.resultFile); err != nil {
		return err
	}
	if o.result != nil && o.cancelled {
		return errors.New("--result and --result-file are a committed effect's: a resolve as cancelled carries none")
	}
	if o.key, err = mandateKeyFromFlags(o.org, o.mandate); err != nil {
		return err
	}
	if o.auth == "" {
		return errors.New("--authorization is required with a decision")
	}
	return nil
}

func runReconcile(ctx context.Context, a *app, o *reconcileOptions) int {
	if !o.deciding {
		return reconcileList(ctx, a, &o.db, o.olderThan.d, o.org, o.limit, o.asJSON, o.timeout)
	}
	key, auth, topics := o.key, o.auth, o.topics
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	op, closeDB, err := o.db.operator(ctx)
	if err != nil {
		a.errorf("reconcile: %v", err)
		return exitFailed
	}
	defer closeDB()
	cur, err := op.Authorization(ctx, key, auth)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		a.errorf("reconcile: no authorization %s under %s", auth, key)
		return exitFailed
	case err != nil:
		a.errorf("reconcile: %v", err)
		return exitFailed
	}
	if cur.State != wire.StateInDoubt && !cur.State.Terminal() {
		a.errorf("reconcile: %s is %s, not in doubt: nothing to reconcile (only an in-doubt execution is resolved)", auth, cur.State)
		return exitFailed
	}
	resolve := client.Resolve{AuthorizationRef: client.AuthorizationRef{Org: key.Org, MandateID: key.MandateID, AuthorizationID: auth},
		Outcome: wire.ResolveCancelled, Evidence: o.evidence, ExecutionToken: cur.ExecutionToken, Reconciler: o.reconciler}
	if o.committed != "" {
		resolve.Outcome, resolve.ExternalRef, resolve.Result = wire.ResolveCommitted, o.committed, o.result
	}
	if o.token != 0 {
		resolve.ExecutionToken = o.token
	}
	signer, err := o.signing.signer()
	if err != nil {
		return a.usageErr("%v", err)
	}
	// The same record the gateway's console sends (client.Record).
	value, _, err := client.Record(resolve, signer)
	var inv *client.InvalidCommandError
	switch {
	case errors.As(err, &inv):
		a.errorf("reconcile: the resolve is invalid (%s): %s", inv.Reason, inv.Detail)
		return exitUsage
	case err != nil:
		a.errorf("reconcile: %v", err)
		return exitFailed
	}
	opts, err := o.kc.opts()
	if err != nil {
		return a.usageErr("%v", err)
	}
	s := sender{opts: opts, topic: topics.grants, decisions: topics.decisions}
	src, err := s.produce(ctx, key, value, a)
	if err != nil {
		if ctx.Err() != nil {
			a.errorf("reconcile: timed out producing to %s; the resolve may or may not have been written: %v", topics.grants, err)
			return exitTimeout
		}
		a.errorf("reconcile: %v", err)
		return exitFailed
	}
	d, raw, err := s.await(ctx, src)
	if err != nil {
		if ctx.Err() != nil && a.ctx.Err() == nil {
			a.errorf("reconcile: no decision for %s/%d@%d within %s; the resolve was produced and will still be decided", src.Topic, src.Partition, src.Offset, o.timeout)
			return exitTimeout
		}
		a.errorf("reconcile: waiting for the decision: %v", err)
		return exitFailed
	}
	if o.asJSON {
		fmt.Fprintf(a.stdout, "%s\n", raw)
	} else {
		printDecision(a.stdout, d)
	}
	return outcomeExit(d.Outcome)
}

// defaultReconciler names the operator running mandatectl: "mandatectl:"
// and the login name when it is an id, else "mandatectl".
func defaultReconciler() string {
	if u := os.Getenv("USER"); u != "" && partitioner.ValidID("mandatectl:"+u) {
		return "mandatectl:" + u
	}
	return "mandatectl"
}

// readResult reads the provider's answer of --result or --result-file: a
// JSON object (the decoder re-encodes it and bounds its size).
func readResult(inline, file string) (json.RawMessage, error) {
	var b []byte
	switch {
	case inline != "" && file != "":
		return nil, errors.New("--result and --result-file exclude each other")
	case inline != "":
		b = []byte(inline)
	case file != "":
		var err error
		if b, err = os.ReadFile(file); err != nil {
			return nil, fmt.Errorf("--result-file: %w", err)
		}
	default:
		return nil, nil
	}
	b = bytes.TrimSpace(b)
	if !json.Valid(b) || len(b) == 0 || b[0] != '{' {
		return nil, errors.New("the result must be a JSON object")
	}
	return b, nil
}

func reconcileList(ctx context.Context, a *app, db *dbConn, olderThan time.Duration, org string, limit int, asJSON bool, timeout time.Duration) int {
	ctx, cancel := withTimeout(ctx, timeout)
	defer cancel()
	op, closeDB, err := db.operator(ctx)
	if err != nil {
		a.errorf("reconcile: %v", err)
		return exitFailed
	}
	defer closeDB()
	rows, err := op.InDoubt(ctx, olderThan, org, limit)
	if err != nil {
		a.errorf("reconcile: %v", err)
		return exitFailed
	}
	if asJSON {
		views := make([]reconcileView, 0, len(rows))
		for _, r := range rows {
			v := reconcileView{inDoubtView: inDoubtView{Mandate: r.Mandate.String(), AuthorizationID: r.AuthorizationID,
				Partition: r.Partition, Operation: r.Operation, Target: r.Target, MinorUnits: r.Amount, Currency: r.Currency,
				IdempotencyKey: r.IdempotencyKey, ExternalRef: r.ExternalRef, Detail: r.Detail,
				InDoubtSince: r.Since, AgeSeconds: r.Age.Seconds()}, Executor: r.Executor, ExecutionToken: r.ExecutionToken}
			if !r.ExecutionDeadline.IsZero() {
				t := r.ExecutionDeadline
				v.ExecutionDeadline = &t
			}
			views = append(views, v)
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(views)
		return exitOK
	}
	if len(rows) == 0 {
		if olderThan > 0 {
			fmt.Fprintf(a.stdout, "no authorizations in doubt for %s or longer\n", olderThan)
		} else {
			fmt.Fprintln(a.stdout, "no authorizations in doubt")
		}
		return exitOK
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "MANDATE\tAUTHORIZATION\tTOKEN\tEXECUTOR\tEXTERNAL REF\tAGE\tAMOUNT\tDETAIL")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Mandate, r.AuthorizationID, r.ExecutionToken, dash(r.Executor),
			dash(r.ExternalRef), fmtAge(r.Age), wire.FormatAmount(r.Amount, r.Currency), dash(r.Detail))
	}
	_ = tw.Flush()
	if len(rows) == limit {
		a.errorf("reconcile: showing the oldest %d; there may be more (--limit)", limit)
	}
	fmt.Fprintln(a.stdout, "\nAsk the provider about each (the authorization id is its idempotency key), then:\n"+
		"  mandatectl reconcile --mandate <mandate> --authorization <id> --committed <ref> | --cancelled --evidence <what it said>")
	return exitOK
}
