package mcpguard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/wire"
)

// callGuarded runs one call of a guarded tool: validate, propose, execute
// (begin, forward, commit) through client.Execute, answer with the
// recorded result.
func (g *Guard) callGuarded(ctx context.Context, gt *guardedTool, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	start := time.Now()
	// The call runs to its end even when the agent stops waiting (it
	// cancels its request, or disconnects): a forwarded call cancelled
	// half-way would be in doubt, and a begin abandoned would hold the
	// use until the execution timeout. Its repeat gets the recorded result.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.CallTimeout)
	defer cancel()
	log := g.log.With().Str("tool", gt.name).Logger()
	res, outcome := g.guarded(ctx, gt, req, &log)
	g.m.calls.WithLabelValues(gt.name, outcome).Inc()
	g.m.guard.WithLabelValues(gt.name).Observe(time.Since(start).Seconds())
	if outcome == OutcomeInDoubt {
		g.m.inDoubt.WithLabelValues(gt.name).Inc()
	}
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[MetaOutcome] = outcome
	log.Info().Str("outcome", outcome).Bool("is_error", res.IsError).Dur("took", time.Since(start)).Msg("guarded tool call")
	return res, nil
}

func (g *Guard) guarded(ctx context.Context, gt *guardedTool, req *mcp.CallToolRequest, log *zerolog.Logger) (*mcp.CallToolResult, string) {
	raw := req.Params.Arguments
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	// The arguments are read by the contract's strict scanner: a duplicate
	// or a case-variant member is refused, because the upstream's decoder
	// may read another value than the one checked and proposed (the last
	// duplicate, a case-insensitive match). What passes means one thing to
	// every decoder, and these same bytes are what is forwarded.
	args, rej := wire.ParseData(raw)
	if rej != nil {
		return toolError(nil, "the arguments of %s are refused (%s: %s): a decoder could read other values than the ones checked; nothing was proposed",
			gt.name, rej.Reason, rej.Detail), OutcomeInvalidArguments
	}
	if err := gt.schema.Validate(args); err != nil {
		return toolError(nil, "the arguments of %s do not match its input schema; nothing was proposed: %v", gt.name, err), OutcomeInvalidArguments
	}
	p, err := gt.rule.propose(gt.name, args, req.Params.Meta)
	if err != nil {
		return toolError(nil, "%s: %v; nothing was proposed", gt.name, err), OutcomeInvalidArguments
	}
	*log = log.With().Str("mandate", p.Org+"/"+p.MandateID).Str("idempotency_key", p.IdempotencyKey).Logger()
	if gt.rule.Recorded {
		return g.read(ctx, gt, req, p, raw, log)
	}
	if err := g.up.ready(ctx); err != nil {
		log.Warn().Err(err).Msg("upstream unavailable; nothing proposed")
		return toolError(nil, "the upstream MCP server is unavailable (%v); nothing was proposed: the same call can be repeated", err), OutcomeUpstreamUnavailable
	}

	d, err := g.cl.Send(ctx, proposeCommand(p))
	var inv *client.InvalidCommandError
	switch {
	case errors.As(err, &inv):
		return toolError(nil, "%s: the proposal derived from the arguments is invalid (%s): %s; nothing was proposed", gt.name, inv.Reason, inv.Detail), OutcomeInvalidArguments
	case err != nil:
		log.Warn().Err(err).Msg("no decision on the proposal")
		return toolError(nil, "mandated did not answer the proposal for %s in time (%v): repeat the same call (same intent): it is answered once", gt.name, err), OutcomeNoDecision
	}
	if d.Authorization == nil || (d.Outcome != wire.OutcomeReserved && d.Outcome != wire.OutcomeReplayed) {
		outcome := d.Outcome
		if d.Outcome == wire.OutcomeReplayed && d.OriginalOutcome != "" {
			outcome = d.OriginalOutcome
		}
		log.Info().Str("decision", d.DecisionID).Str("outcome", string(outcome)).Str("reason", string(d.Reason)).Msg("proposal not authorized; upstream not called")
		return toolError(&d.Decision, "mandated did not authorize %s: %s, reason %s (decision %s)%s; the upstream was not called",
			gt.name, outcome, d.Reason, d.DecisionID, detail(d.Detail)), OutcomeDenied
	}
	*log = log.With().Str("authorization", d.AuthorizationID).Logger()
	// A replay answers the intent's recorded authorization whatever this
	// call asked: where its terms are not this call's, its result is not
	// this call's answer (a repeat with amount 1300 is not the 1234 refund).
	if d.Outcome == wire.OutcomeReplayed {
		named := d.Differs
		if len(named) == 0 { // a server before the differs member: the same comparison here
			named = differs(d.Authorization, p)
		}
		if fields := unaccepted(named, gt.rule.AcceptDiffers); len(fields) > 0 {
			a := d.Authorization
			res := toolError(&d.Decision, "%s: this call differs from the recorded authorization %s of its intent in %s (recorded: %s of %s to %q, now %s; this call: %s of %s to %q): "+
				"the intent's answer is not this call's, and the upstream was not called. A new action is another step; a rule whose terms are regenerated on a repeat names them in accept_differs",
				gt.name, a.ID, strings.Join(fields, ", "), a.Operation, money(a.Amount), a.Target, a.State, p.Operation, money(p.Amount), p.Target)
			res.Meta[MetaAuthorizationID] = a.ID
			return res, OutcomeDiffers
		}
	}
	// A replay shows the authorization as it is now. In doubt, it waits for
	// an operator: a begin would be refused already_executing and the call
	// would wait for a winner that is not coming. Committed, its recorded
	// result is already here.
	// Cancelled, expired or revoked, nothing ran and nothing will: a begin
	// would only be refused.
	switch state := d.Authorization.State; {
	case state == wire.StateInDoubt:
		return inDoubt(gt, d.AuthorizationID, &d.Decision), OutcomeInDoubt
	case state == wire.StateCommitted:
		return g.answer(gt, &d.Decision, d.Result(), OutcomeReplayed)
	case state.Terminal():
		return notRun(gt, &d.Decision), OutcomeNotExecuted
	}

	var (
		ran         *mcp.CallToolResult // the upstream's answer when this call forwarded it
		notSent     error
		upstreamErr bool
	)
	fn := func(ctx context.Context, providerKey string) (client.Effect, error) {
		meta := mcp.Meta{}
		for k, v := range req.Params.Meta {
			meta[k] = v
		}
		meta[MetaAuthorizationID] = providerKey
		uctx, cancel := context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
		defer cancel()
		start := time.Now()
		res, err := g.up.call(uctx, &mcp.CallToolParams{Meta: meta, Name: gt.name, Arguments: raw})
		g.observeUpstream(gt.name, start, res, err)
		if err != nil {
			if notExecuted(err) {
				notSent = err
				return client.Effect{}, fmt.Errorf("%w: %w", client.ErrNotExecuted, err)
			}
			return client.Effect{}, fmt.Errorf("%w: upstream call: %w", client.ErrOutcomeUnknown, err)
		}
		ran = res
		if res.IsError && gt.rule.OnToolError == OnToolErrorCancel {
			upstreamErr = true
			return client.Effect{}, fmt.Errorf("%w: the upstream answered a tool error: %s", client.ErrNotExecuted, textOf(res))
		}
		rec, err := record(res, g.cfg.MaxResultBytes, gt.output != nil)
		if err != nil {
			return client.Effect{}, fmt.Errorf("%w: %w", client.ErrOutcomeUnknown, err)
		}
		if err := failpoint.Inject(ctx, FailpointAfterForward); err != nil {
			return client.Effect{}, fmt.Errorf("%w: %w", client.ErrOutcomeUnknown, err)
		}
		sum := sha256.Sum256(rec)
		return client.Effect{ExternalRef: "mcp:" + hex.EncodeToString(sum[:12]), Result: rec}, nil
	}
	ex, err := g.cl.Execute(ctx, client.RefOf(d), fn, client.AcceptDiffers(gt.rule.AcceptDiffers...))
	var inProgress *client.InProgressError
	var last *wire.Decision
	if ex != nil && ex.Decision != nil {
		last = &ex.Decision.Decision
	}
	switch {
	case err == nil:
		outcome := OutcomeReplayed
		if ex.Ran {
			outcome = OutcomeExecuted
		}
		// The one that ran the tool is answered from the record too: every
		// caller of the intent gets the same answer.
		return g.answer(gt, last, ex.Result, outcome)
	case errors.As(err, &inProgress):
		// Begun by another executor (a concurrent call, or a mandate-mcp
		// that died before its commit) and not finished within the loser
		// wait: said at once, with who executes it, since when, and from
		// when an operator can settle it, rather than holding the agent
		// until the execution deadline.
		ip := inProgress
		res := toolError(last, "%s is being executed by %s since %s (authorization %s) and was not finished within the wait for it (%v): "+
			"repeat this same call (same intent) to get its outcome; if it is still unfinished it becomes reconcilable from %s (an operator settles it with 'mandatectl reconcile')",
			gt.name, ip.Executor, stamp(ip.Since), ip.AuthorizationID, ip.Cause, stamp(ip.ReconcilableAt))
		res.Meta[MetaAuthorizationID] = ip.AuthorizationID
		res.Meta[MetaExecutor] = ip.Executor
		res.Meta[MetaSince] = stamp(ip.Since)
		if !ip.ReconcilableAt.IsZero() {
			res.Meta[MetaReconcilableAt] = stamp(ip.ReconcilableAt)
		}
		return res, OutcomeInProgress
	case errors.Is(err, client.ErrInDoubt):
		if ex != nil && !ex.Ran && last != nil && last.Authorization != nil && last.Authorization.State == wire.StateExecuting {
			return toolError(last, "%s is still being executed by another call (authorization %s): its result was not seen within %s; repeat this same call (same intent) to get it",
				gt.name, d.AuthorizationID, g.cfg.CallTimeout), OutcomeNoDecision
		}
		log.Warn().Err(err).Msg("in doubt: for an operator")
		if last == nil {
			last = &d.Decision
		}
		return inDoubt(gt, d.AuthorizationID, last), OutcomeInDoubt
	case errors.Is(err, client.ErrNotCommitted):
		if upstreamErr && ran != nil {
			return ran, OutcomeNotExecuted // the upstream's own error, and the use released
		}
		state, reason, id := wire.AuthState(""), wire.Reason(""), d.DecisionID
		if last != nil {
			id, reason = last.DecisionID, last.Reason
			if last.Authorization != nil {
				state = last.Authorization.State
			}
		}
		switch {
		case answered(notSent) != nil:
			return toolError(last, "the upstream MCP server refused the call before running it (%v); authorization %s was cancelled (decision %s): nothing was executed",
				notSent, d.AuthorizationID, id), OutcomeNotExecuted
		case notSent != nil:
			return toolError(last, "the upstream MCP server could not be reached (%v); authorization %s was cancelled (decision %s): nothing was executed",
				notSent, d.AuthorizationID, id), OutcomeNotExecuted
		}
		if last != nil && last.Authorization != nil && last.Authorization.State.Terminal() {
			return notRun(gt, last), OutcomeNotExecuted
		}
		return toolError(last, "%s was not executed: authorization %s is %s, reason %s (decision %s)", gt.name, d.AuthorizationID, state, reason, id), OutcomeNotExecuted
	default:
		log.Warn().Err(err).Msg("execution failed before the upstream was called")
		return toolError(last, "%s: %v; the upstream was not called by this call: repeat the same call (same intent)", gt.name, err), OutcomeNoDecision
	}
}

// answer is a committed authorization's recorded result, as every caller
// of the intent gets it: mandate-mcp's own record, or what an operator's
// reconciliation recorded (nothing, or the provider's answer). It names
// the authorization, never this call's decision, so that every caller
// gets the same answer.
func (g *Guard) answer(gt *guardedTool, d *wire.Decision, result []byte, outcome string) (*mcp.CallToolResult, string) {
	res, ours, err := recorded(result)
	switch {
	case err != nil:
		return toolError(d, "%s was executed once (authorization %s), but %v", gt.name, d.AuthorizationID, err), outcome
	case ours:
		return res, outcome
	}
	return settledAnswer(gt, d, result), outcome
}

// settledAnswer answers an authorization an operator settled as committed
// (mandatectl reconcile --committed REF [--result-file F]): the provider's
// answer the operator recorded as the tool's structured content (or as
// the tool's result, when it is one), and a text naming the reference and
// the evidence. A tool with an output schema gets a success only with
// structured content that matches it (a client refuses any other); without
// it the answer is marked an error and says the tool ran.
func settledAnswer(gt *guardedTool, d *wire.Decision, result []byte) *mcp.CallToolResult {
	a := d.Authorization
	if a == nil {
		a = &wire.AuthorizationView{ID: d.AuthorizationID}
	}
	how := "settled by reconciliation"
	if a.ResolvedBy != "" {
		how += " (" + a.ResolvedBy + ")"
	}
	if a.Detail != "" {
		how += ": " + a.Detail
	}
	text := fmt.Sprintf("%s was executed once (authorization %s, external reference %s), %s", gt.name, a.ID, a.ExternalRef, how)
	res := &mcp.CallToolResult{Meta: mcp.Meta{MetaAuthorizationID: a.ID}}
	var tool mcp.CallToolResult
	var probe struct {
		Content json.RawMessage `json:"content"`
	}
	switch {
	case len(result) == 0:
		text += "; no result was recorded"
	case json.Unmarshal(result, &probe) == nil && len(probe.Content) > 0 && json.Unmarshal(result, &tool) == nil:
		// The operator recorded a tool result (the upstream's answer).
		res.Content, res.StructuredContent, res.IsError = tool.Content, tool.StructuredContent, tool.IsError
	default:
		var v any
		_ = json.Unmarshal(result, &v)
		res.StructuredContent = v
		text += "; the result recorded: " + string(result)
	}
	if res.Content == nil {
		res.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	}
	if gt.output != nil && !res.IsError {
		if why := gt.checkOutput(res.StructuredContent); why != "" {
			// A client checks structured content even on an error: it is
			// dropped (the text above carries it).
			res.IsError, res.StructuredContent = true, nil
			res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf(
				"[mandated: %s ran once; this answer is marked an error only because %s]", gt.name, why)})
		}
	}
	return res
}

// notRun answers an authorization that ended without the tool running
// (cancelled, expired, revoked), saying what the command that ended it
// said (a cancel's proof, an operator's evidence).
func notRun(gt *guardedTool, d *wire.Decision) *mcp.CallToolResult {
	a := d.Authorization
	how := ""
	switch {
	case a.Resolved:
		how = " by reconciliation"
		if a.ResolvedBy != "" {
			how += " (" + a.ResolvedBy + ")"
		}
		if a.Detail != "" {
			how += ": " + a.Detail
		}
	case a.Detail != "":
		how = ": " + a.Detail
	}
	res := toolError(d, "%s was not executed: authorization %s is %s%s; the upstream was not called by this call", gt.name, a.ID, a.State, how)
	res.Meta[MetaAuthorizationID] = a.ID
	return res
}

func inDoubt(gt *guardedTool, authorizationID string, d *wire.Decision) *mcp.CallToolResult {
	res := toolError(d, "the outcome of %s is in doubt (authorization %s): do not retry by hand; an operator reconciles it with 'mandatectl reconcile'",
		gt.name, authorizationID)
	res.Meta[MetaAuthorizationID] = authorizationID
	return res
}

func detail(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func decisionMeta(d *wire.Decision) mcp.Meta {
	m := mcp.Meta{}
	if d == nil {
		return m
	}
	m[MetaDecisionID] = d.DecisionID
	if d.Reason != "" {
		m[MetaReason] = string(d.Reason)
	}
	if d.AuthorizationID != "" {
		m[MetaAuthorizationID] = d.AuthorizationID
	}
	return m
}

// toolError is a tool result with isError set: the agent's model sees it.
func toolError(d *wire.Decision, format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}, Meta: decisionMeta(d)}
}

// proposeCommand is the propose as the contract's JSON (client.Propose has
// no intent member).
func proposeCommand(p *proposal) client.RawCommand {
	m := map[string]any{"type": "propose", "org": p.Org, "mandate_id": p.MandateID, "idempotency_key": p.IdempotencyKey,
		"operation": p.Operation, "amount": p.Amount, "target": p.Target}
	if p.Intent != nil {
		m["intent"] = p.Intent
	}
	b, _ := json.Marshal(m)
	return client.RawCommand(b)
}

// differs names the terms in which the recorded authorization a is not
// the proposal p, sorted as the contract's differs member.
func differs(a *wire.AuthorizationView, p *proposal) []string {
	var out []string
	if a.Amount.MinorUnits != p.Amount.MinorUnits {
		out = append(out, "amount")
	}
	if a.Amount.Currency != p.Amount.Currency {
		out = append(out, "currency")
	}
	if a.Operation != p.Operation {
		out = append(out, "operation")
	}
	if a.Target != p.Target {
		out = append(out, "target")
	}
	return out
}

// unaccepted is fields without the accepted ones.
func unaccepted(fields, accepted []string) []string {
	var out []string
	for _, f := range fields {
		if !slices.Contains(accepted, f) {
			out = append(out, f)
		}
	}
	return out
}

func money(m wire.Money) string {
	return fmt.Sprintf("%d %s (minor units)", m.MinorUnits, m.Currency)
}

// stamp writes a time for an agent and an operator: UTC, to the second.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "(unknown)"
	}
	return t.UTC().Format(time.RFC3339)
}
