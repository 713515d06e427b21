package mcpguard

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/wire"
)

// A recorded read (Rule.Recorded, issue 42 item 4; seed 003: a retrieval's
// result is kept with the task and reused on replay) is mandated's record
// command under the call's intent: a look-up first (a record without a
// result: replayed with the first result, or refused not_recorded); when
// nothing is recorded, the call is forwarded and its answer recorded. The
// first record of an intent wins: a concurrent read that records second is
// answered the first result, so every caller of the intent gets the same
// answer. A read takes no authority and is never begun or committed.
const (
	outcomeRecorded wire.Outcome = "recorded"     // wire.OutcomeRecorded
	reasonNotYet    wire.Reason  = "not_recorded" // wire.ReasonNotRecorded
)

func (g *Guard) read(ctx context.Context, gt *guardedTool, req *mcp.CallToolRequest, p *proposal, raw json.RawMessage, log *zerolog.Logger) (*mcp.CallToolResult, string) {
	if p.Intent == nil {
		return toolError(nil, "%s is a recorded read: its intent must name a run id and a step in the id grammar ([A-Za-z0-9][A-Za-z0-9._:-]{0,127}); nothing was read", gt.name), OutcomeInvalidArguments
	}
	d, res, outcome := g.sendRecord(ctx, gt, p, nil)
	if res != nil {
		return res, outcome
	}
	switch {
	case d.Outcome == wire.OutcomeReplayed:
		return g.recordedAnswer(gt, d, OutcomeReplayed)
	case d.Outcome != wire.OutcomeRefused || d.Reason != reasonNotYet:
		return toolError(&d.Decision, "mandated did not record %s: %s, reason %s (decision %s)%s; the upstream was not called",
			gt.name, d.Outcome, d.Reason, d.DecisionID, detail(d.Detail)), OutcomeDenied
	}

	uctx, cancel := context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
	defer cancel()
	start := time.Now()
	ans, err := g.up.call(uctx, &mcp.CallToolParams{Meta: req.Params.Meta, Name: gt.name, Arguments: raw})
	g.observeUpstream(gt.name, start, ans, err)
	switch {
	case err != nil:
		log.Warn().Err(err).Msg("recorded read: the upstream failed; nothing recorded")
		return toolError(nil, "the upstream MCP server did not answer %s (%v); nothing was recorded: the same call can be repeated", gt.name, err), OutcomeUpstreamUnavailable
	case ans.IsError:
		// A read that failed is not its answer for good: not recorded, a
		// repeat reads again.
		return ans, OutcomeNotRecorded
	}
	rec, err := record(ans, g.cfg.MaxResultBytes, gt.output != nil)
	if err != nil {
		return toolError(nil, "%s: %v; nothing was recorded: the same call can be repeated", gt.name, err), OutcomeNotRecorded
	}
	d, res, outcome = g.sendRecord(ctx, gt, p, rec)
	if res != nil {
		return res, outcome
	}
	switch d.Outcome {
	case outcomeRecorded:
		return g.recordedAnswer(gt, d, OutcomeRecorded)
	case wire.OutcomeReplayed: // another caller of the intent recorded first
		return g.recordedAnswer(gt, d, OutcomeReplayed)
	}
	return toolError(&d.Decision, "mandated did not record %s: %s, reason %s (decision %s)%s; its answer was read but not recorded",
		gt.name, d.Outcome, d.Reason, d.DecisionID, detail(d.Detail)), OutcomeNotRecorded
}

// sendRecord sends a record (a look-up when rec is nil) and waits for its
// decision; res is the call's answer when there is none.
func (g *Guard) sendRecord(ctx context.Context, gt *guardedTool, p *proposal, rec json.RawMessage) (*client.Decision, *mcp.CallToolResult, string) {
	m := map[string]any{"type": "record", "org": p.Org, "mandate_id": p.MandateID, "idempotency_key": p.IdempotencyKey,
		"operation": p.Operation, "target": p.Target, "intent": p.Intent}
	if rec != nil {
		m["result"] = rec
	}
	b, _ := json.Marshal(m)
	d, err := g.cl.Send(ctx, client.RawCommand(b))
	var inv *client.InvalidCommandError
	switch {
	case errors.As(err, &inv):
		return nil, toolError(nil, "%s: the record derived from the arguments is invalid (%s): %s", gt.name, inv.Reason, inv.Detail), OutcomeInvalidArguments
	case err != nil:
		return nil, toolError(nil, "mandated did not answer the record of %s in time (%v): repeat the same call (same intent)", gt.name, err), OutcomeNoDecision
	}
	return d, nil, ""
}

// recordedAnswer is the read's recorded answer, the same for every caller.
func (g *Guard) recordedAnswer(gt *guardedTool, d *client.Decision, outcome string) (*mcp.CallToolResult, string) {
	res, ours, err := recorded(d.Result())
	switch {
	case err != nil:
		return toolError(&d.Decision, "%s: %v", gt.name, err), outcome
	case !ours:
		return toolError(&d.Decision, "%s: the recorded read (authorization %s) holds no result of mandate-mcp's", gt.name, d.AuthorizationID), outcome
	}
	return res, outcome
}
