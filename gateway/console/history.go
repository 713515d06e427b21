package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// latestDecisions is how many of its decisions a mandate's page shows.
const latestDecisions = 10

// historyUnavailable answers a page whose history read failed.
func (c *Console) historyUnavailable(w http.ResponseWriter, r *http.Request, s *session, what string, err error) {
	if errors.Is(err, sink.ErrHistoryUnavailable) {
		c.log.Warn().Err(err).Str("path", r.URL.Path).Msg("console: the decision history cannot be read")
		c.fail(w, r, s, http.StatusServiceUnavailable, "Cannot "+what+": "+strings.TrimPrefix(err.Error(), "sink: ")+".")
		return
	}
	c.unavailable(w, r, s, what, err)
}

// parseCursor reads a history page's "before" parameter:
// unix-nanoseconds.partition.sequence.
func parseCursor(s string) (*sink.HistoryCursor, bool) {
	if s == "" {
		return nil, true
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return nil, false
	}
	ns, err1 := strconv.ParseInt(parts[0], 10, 64)
	p, err2 := strconv.ParseInt(parts[1], 10, 32)
	seq, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, false
	}
	return &sink.HistoryCursor{DecidedAt: time.Unix(0, ns).UTC(), Partition: int32(p), Seq: seq}, true
}

func formatCursor(c sink.HistoryCursor) string {
	return fmt.Sprintf("%d.%d.%d", c.DecidedAt.UnixNano(), c.Partition, c.Seq)
}

// keptNote says what the history holds, for a page that shows part of it.
type keptNote struct {
	Kept     sink.HistoryKept
	Complete bool // everything since the page's subject began is kept
	Off      bool
}

func (c *Console) keptSince(kept sink.HistoryKept, since time.Time) keptNote {
	return keptNote{Kept: kept, Complete: kept.Complete(since, c.cfg.Now()), Off: kept.Retention == 0}
}

// ---- a mandate's history

func (c *Console) mandateHistoryPage(w http.ResponseWriter, r *http.Request, s session) {
	key, err := partitioner.NewMandateKey(r.PathValue("org"), r.PathValue("mandate"))
	if err != nil {
		c.fail(w, r, &s, http.StatusBadRequest, err.Error())
		return
	}
	before, ok := parseCursor(r.URL.Query().Get("before"))
	if !ok {
		c.fail(w, r, &s, http.StatusBadRequest, "That is not a page of this history (before=NANOSECONDS.PARTITION.SEQUENCE).")
		return
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	op := c.src.Operator()
	snap, err := op.Inspect(ctx, key, 0)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		c.fail(w, r, &s, http.StatusNotFound, fmt.Sprintf("No mandate %s.", key))
		return
	case err != nil:
		c.unavailable(w, r, &s, "read the mandate", err)
		return
	}
	entries, err := op.MandateHistory(ctx, key, before, c.cfg.HistoryPage+1)
	if err != nil {
		c.historyUnavailable(w, r, &s, "read the mandate's history", err)
		return
	}
	kept, err := op.HistoryKept(ctx)
	if err != nil {
		c.historyUnavailable(w, r, &s, "read the history's settings", err)
		return
	}
	data := map[string]any{"Key": key, "M": snap.Mandate, "First": before == nil, "Note": c.keptSince(kept, snap.Mandate.CreatedAt)}
	if len(entries) > c.cfg.HistoryPage {
		entries = entries[:c.cfg.HistoryPage]
		data["Older"] = formatCursor(entries[len(entries)-1].Cursor())
	}
	data["Rows"] = views(entries)
	c.render(w, r, http.StatusOK, "history", &s, data)
}

func views(entries []sink.HistoryEntry) []decisionView {
	out := make([]decisionView, 0, len(entries))
	for _, e := range entries {
		out = append(out, viewOf(e))
	}
	return out
}

// ---- an authorization's timeline

// flowStep is one step of an authorization's life: propose, begin,
// commit, report, resolve, cancel, a deadline or a revoke.
type flowStep struct {
	Name       string
	At         time.Time
	Actor      string
	DecisionID string
	Note       string
	Class      string
}

// timelineCounts counts the decisions about an authorization that changed
// nothing: repeats (the same intent or the same executor again, answered
// with the recorded decision) and losers (begins by other executors).
type timelineCounts struct {
	Decisions, ProposeRepeats, BeginRepeats, OtherRepeats, Losers, Refused int
}

func (c *Console) authorizationPage(w http.ResponseWriter, r *http.Request, s session) {
	key, err := partitioner.NewMandateKey(r.PathValue("org"), r.PathValue("mandate"))
	if err != nil {
		c.fail(w, r, &s, http.StatusBadRequest, err.Error())
		return
	}
	id := r.PathValue("authorization")
	ctx, cancel := c.queryContext(r)
	defer cancel()
	op := c.src.Operator()
	a, err := op.Authorization(ctx, key, id)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		c.fail(w, r, &s, http.StatusNotFound, fmt.Sprintf("No authorization %s under %s.", id, key))
		return
	case err != nil:
		c.unavailable(w, r, &s, "read the authorization", err)
		return
	}
	entries, err := op.AuthorizationHistory(ctx, key, id, c.cfg.Timeline+1)
	if err != nil {
		c.historyUnavailable(w, r, &s, "read the authorization's decisions", err)
		return
	}
	kept, err := op.HistoryKept(ctx)
	if err != nil {
		c.historyUnavailable(w, r, &s, "read the history's settings", err)
		return
	}
	data := map[string]any{"Key": key, "A": a, "Note": c.keptSince(kept, a.CreatedAt), "Result": resultRows(a.Result)}
	if len(entries) > c.cfg.Timeline {
		entries = entries[:c.cfg.Timeline]
		data["Limited"] = c.cfg.Timeline
	}
	steps := views(entries)
	var counts timelineCounts
	var flow []flowStep
	begin := -1
	for _, v := range steps {
		counts.Decisions++
		if v.D != nil && v.D.Binds != nil && v.D.Binds.Intent != nil {
			data["Intent"] = v.D.Binds.Intent
		}
		step := flowStep{Name: v.Stage, At: v.At, Actor: v.Actor, DecisionID: v.ID, Class: outcomeClass(v.Outcome)}
		switch v.Stage {
		case "repeat":
			switch v.Command {
			case string(wire.CmdPropose):
				counts.ProposeRepeats++
			case string(wire.CmdBegin):
				counts.BeginRepeats++
			default:
				counts.OtherRepeats++
			}
			continue
		case "loser":
			counts.Losers++
			continue
		case "refused":
			counts.Refused++
			continue
		case "reserve":
			step.Name, step.Note = "propose → reserve", v.Summary
		case "begin":
			begin = len(flow)
			step.Note = v.Summary
		case "commit", "resolve", "report", "cancel", "deadline", "revoke":
			step.Note = v.Summary
		}
		flow = append(flow, step)
	}
	if begin >= 0 && (counts.Losers > 0 || counts.BeginRepeats > 0) {
		flow[begin].Note += fmt.Sprintf(" · %d loser%s, %d repeat%s", counts.Losers, plural(int64(counts.Losers)),
			counts.BeginRepeats, plural(int64(counts.BeginRepeats)))
	}
	data["Steps"], data["Flow"], data["Counts"] = steps, flow, counts
	c.render(w, r, http.StatusOK, "authorization", &s, data)
}

// ---- one decision

// parseDecisionID reads "partition-sequence".
func parseDecisionID(s string) (int32, int64, bool) {
	ps, ss, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, false
	}
	p, err1 := strconv.ParseInt(ps, 10, 32)
	seq, err2 := strconv.ParseInt(ss, 10, 64)
	if err1 != nil || err2 != nil || p < 0 || seq <= 0 || strconv.FormatInt(p, 10) != ps || strconv.FormatInt(seq, 10) != ss {
		return 0, 0, false
	}
	return int32(p), seq, true
}

func (c *Console) decisionPage(w http.ResponseWriter, r *http.Request, s session) {
	id := r.PathValue("id")
	p, seq, ok := parseDecisionID(id)
	if !ok {
		c.fail(w, r, &s, http.StatusBadRequest, fmt.Sprintf("%q is not a decision id (partition-sequence, as 3-1042).", id))
		return
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	e, err := c.src.Operator().Decision(ctx, p, seq)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		c.fail(w, r, &s, http.StatusNotFound, fmt.Sprintf("No decision %s is kept: it is older than the history, or not decided yet.", id))
		return
	case err != nil:
		c.historyUnavailable(w, r, &s, "read the decision", err)
		return
	}
	v := viewOf(*e)
	raw := string(e.Payload)
	if pretty, err := json.MarshalIndent(json.RawMessage(e.Payload), "", "  "); err == nil {
		raw = string(pretty)
	}
	c.render(w, r, http.StatusOK, "decision", &s, map[string]any{"V": v, "Raw": raw})
}

// authorizationURL is the page of an authorization's timeline.
func authorizationURL(k partitioner.MandateKey, id string) string {
	return "/console/authorizations/" + url.PathEscape(k.Org) + "/" + url.PathEscape(k.MandateID) + "/" + url.PathEscape(id)
}
