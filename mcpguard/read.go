package mcpguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/client"
)

// read runs a recorded read (Rule.Recorded, issue 42 item 4; seed 003: a
// retrieval's result is kept with the task and reused on replay) through
// client.Read: the intent's record is looked up first; only when nothing
// is recorded is the call forwarded, and its answer recorded (mandated's
// record command). The first answer recorded for an intent is every
// caller's, a concurrent first reader's too. A read takes no authority and
// is never begun or committed; an answer with isError is not recorded (a
// repeat reads again).
func (g *Guard) read(ctx context.Context, gt *guardedTool, req *mcp.CallToolRequest, p *proposal, raw json.RawMessage, log *zerolog.Logger) (*mcp.CallToolResult, string) {
	if p.Intent == nil {
		return toolError(nil, "%s is a recorded read: its intent must name a run id and a step in the id grammar ([A-Za-z0-9][A-Za-z0-9._:-]{0,127}); nothing was read", gt.name), OutcomeInvalidArguments
	}
	var (
		answer   *mcp.CallToolResult // the upstream's, when this call read it
		notSaved error               // why the upstream's answer is not recorded
	)
	fn := func(ctx context.Context) (json.RawMessage, error) {
		uctx, cancel := context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
		defer cancel()
		start := time.Now()
		res, err := g.up.call(uctx, &mcp.CallToolParams{Meta: req.Params.Meta, Name: gt.name, Arguments: raw})
		g.observeUpstream(gt.name, start, res, err)
		switch {
		case err != nil:
			notSaved = fmt.Errorf("the upstream MCP server did not answer: %w", err)
			return nil, notSaved
		case res.IsError:
			answer, notSaved = res, errors.New("the upstream answered a tool error")
			return nil, notSaved
		}
		answer = res
		rec, err := record(res, g.cfg.MaxResultBytes, gt.output != nil)
		if err != nil {
			notSaved = err
		}
		return rec, err
	}
	rd, err := g.cl.Read(ctx, client.RecordRead{Ref: client.Ref{Org: p.Org, MandateID: p.MandateID}, Operation: p.Operation,
		Intent: *p.Intent, Target: p.Target, IdempotencyKey: p.IdempotencyKey}, fn)
	var inv *client.InvalidCommandError
	switch {
	case notSaved != nil && answer != nil && answer.IsError:
		return answer, OutcomeNotRecorded // a failed read is not its answer for good
	case notSaved != nil:
		log.Warn().Err(notSaved).Msg("recorded read: nothing recorded")
		return toolError(nil, "%s: %v; nothing was recorded: the same call can be repeated", gt.name, notSaved), OutcomeNotRecorded
	case errors.As(err, &inv):
		return toolError(nil, "%s: the record derived from the arguments is invalid (%s): %s", gt.name, inv.Reason, inv.Detail), OutcomeInvalidArguments
	case errors.Is(err, client.ErrNotRecordable) && rd != nil && rd.Decision != nil:
		d := rd.Decision
		return toolError(&d.Decision, "mandated did not record %s: %s, reason %s (decision %s)%s; the upstream was not called by this call",
			gt.name, d.Outcome, d.Reason, d.DecisionID, detail(d.Detail)), OutcomeDenied
	case err != nil:
		log.Warn().Err(err).Msg("recorded read: no decision")
		return toolError(nil, "mandated did not answer the record of %s in time (%v): repeat the same call (same intent)", gt.name, err), OutcomeNoDecision
	}
	outcome := OutcomeReplayed
	if rd.Recorded {
		outcome = OutcomeRecorded
	}
	res, ours, err := recorded(rd.Result)
	switch {
	case err != nil:
		return toolError(&rd.Decision.Decision, "%s: %v", gt.name, err), outcome
	case !ours:
		return toolError(&rd.Decision.Decision, "%s: the recorded read (authorization %s) holds no result of mandate-mcp's", gt.name, rd.Decision.AuthorizationID), outcome
	}
	return res, outcome
}
