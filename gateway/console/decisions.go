package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// decisionView is one decision as the history, the timeline, the search
// and the decision page show it: who, when, what it decided and what it
// said, read from the decision as published.
type decisionView struct {
	ID              string // partition-sequence
	At              time.Time
	Key             partitioner.MandateKey
	Command         string
	Outcome         string
	Reason          string
	AuthorizationID string
	// Stage names the step of an authorization's life the decision is
	// (timeline): propose, reserve, repeat, begin, loser, commit, ...
	Stage string
	// Actor is who the decision names as having acted: the winning
	// executor, the reconciler, the grantor key that signed, mandated's
	// clock for a deadline; "" when the decision names no one.
	Actor   string
	Summary string // what it decided, in a line
	Detail  string // what it said (the decision's detail)
	Source  string // the record it answers: topic partition@offset
	// InOutbox: not housekept yet (maybe not published yet).
	InOutbox bool
	// Unreadable: the payload is not a decision this console reads.
	Unreadable bool
	D          *wire.Decision
}

// viewOf reads a history entry.
func viewOf(e sink.HistoryEntry) decisionView {
	v := decisionView{ID: e.DecisionID(), At: e.DecidedAt, Key: partitioner.MandateKey{Org: e.Org, MandateID: e.MandateID},
		Command: e.Command, Outcome: e.Outcome, Reason: e.Reason, AuthorizationID: e.AuthorizationID, InOutbox: e.InOutbox}
	d, err := wire.ParseDecision(e.Payload)
	if err != nil {
		v.Unreadable = true
		v.Command = "unknown"
		v.Summary = "a decision this console cannot read (its payload is not a decision of schema version 1)"
		return v
	}
	v.D = d
	v.At = d.DecidedAt.UTC()
	v.Key = partitioner.MandateKey{Org: d.Org, MandateID: d.MandateID}
	v.Command, v.Outcome, v.Reason, v.AuthorizationID = d.Command, string(d.Outcome), string(d.Reason), d.AuthorizationID
	v.Detail = d.Detail
	if d.Source != nil {
		v.Source = fmt.Sprintf("%s %d@%d", d.Source.Topic, d.Source.Partition, d.Source.Offset)
	}
	v.Actor = actorOf(d)
	v.Stage = stageOf(d)
	v.Summary = summaryOf(d)
	return v
}

// actorOf is who a decision names as having acted. A decision carries the
// winning executor (in its authorization view), the reconciler of a
// resolve and the grantor key that signed a grantor command; a proposal's
// agent and a losing begin's executor are named only in their commands
// (on the input topics), not in the decision.
func actorOf(d *wire.Decision) string {
	a := d.Authorization
	switch {
	case d.Command == wire.CommandTimer:
		return "mandated (deadline)"
	case d.Command == string(wire.CmdResolve) && a != nil && a.ResolvedBy != "" && (d.Outcome == wire.OutcomeCommitted || d.Outcome == wire.OutcomeCancelled):
		return "reconciler " + a.ResolvedBy + signedBy(d)
	case d.SignedBy != "":
		return "grantor key " + d.SignedBy
	case d.Command == string(wire.CmdResolve):
		return "a reconciler (named in its command)"
	case d.Command == string(wire.CmdGrant) || d.Command == string(wire.CmdRevoke):
		return "grantor (unsigned)"
	case d.Command == string(wire.CmdBegin) && d.Reason == wire.ReasonAlreadyExecuting:
		return "another executor (named in its command)"
	case d.Command == string(wire.CmdBegin) && a != nil && a.Executor != "":
		return "executor " + a.Executor
	case (d.Command == string(wire.CmdCommit) || d.Command == string(wire.CmdCancel) || d.Command == string(wire.CmdReportUnknown)) &&
		a != nil && a.Executor != "" && d.Reason != wire.ReasonStaleExecutionToken:
		return "executor " + a.Executor
	case d.Command == string(wire.CmdPropose) || d.Command == string(wire.CmdCancel) || d.Command == string(wire.CmdCommit):
		return "agent" // a proposal, or a command before any begin: its sender is named in its command only
	}
	return ""
}

func signedBy(d *wire.Decision) string {
	if d.SignedBy == "" {
		return ""
	}
	return " (signed: " + d.SignedBy + ")"
}

// stageOf is the step of an authorization's life a decision is.
func stageOf(d *wire.Decision) string {
	switch {
	case d.Outcome == wire.OutcomeReplayed:
		return "repeat"
	case d.Reason == wire.ReasonAlreadyExecuting:
		return "loser"
	case d.Command == string(wire.CmdPropose) && d.Outcome == wire.OutcomeReserved:
		return "reserve"
	case d.Command == string(wire.CmdBegin) && d.Outcome == wire.OutcomeExecuting:
		return "begin"
	case d.Command == string(wire.CmdCommit) && d.Outcome == wire.OutcomeCommitted:
		return "commit"
	case d.Command == string(wire.CmdReportUnknown) && d.Outcome == wire.OutcomeInDoubt:
		return "report"
	case d.Command == string(wire.CmdResolve) && (d.Outcome == wire.OutcomeCommitted || d.Outcome == wire.OutcomeCancelled):
		return "resolve"
	case d.Command == string(wire.CmdCancel) && d.Outcome == wire.OutcomeCancelled:
		return "cancel"
	case d.Command == wire.CommandTimer:
		return "deadline"
	case d.Command == string(wire.CmdRevoke) || d.Outcome == wire.OutcomeRevoked:
		return "revoke"
	}
	return "refused"
}

// summaryOf says what a decision decided, in a line.
func summaryOf(d *wire.Decision) string {
	a, m := d.Authorization, d.Mandate
	money := func(v wire.Money) string { return wire.FormatAmount(v.MinorUnits, v.Currency) }
	switch {
	case d.Command == string(wire.CmdGrant) && d.Outcome == wire.OutcomeGranted && m != nil:
		var b strings.Builder
		fmt.Fprintf(&b, "version %d: %d use%s of at most %s", m.Version, m.UsesAllowed, plural(m.UsesAllowed), wire.FormatAmount(m.MaxAmount, m.Currency))
		if m.TotalLimit != nil {
			fmt.Fprintf(&b, ", %s in total", wire.FormatAmount(*m.TotalLimit, m.Currency))
		}
		if len(m.Operations) > 0 {
			fmt.Fprintf(&b, ", %s", strings.Join(m.Operations, ", "))
		}
		if len(m.Targets) > 0 {
			fmt.Fprintf(&b, " to %s", strings.Join(m.Targets, ", "))
		}
		if m.ValidUntil != nil {
			fmt.Fprintf(&b, ", until %s", m.ValidUntil.UTC().Format("2006-01-02 15:04Z"))
		}
		return b.String()
	case d.Outcome == wire.OutcomeReplayed && d.Command == string(wire.CmdBegin):
		return fmt.Sprintf("the same executor again (a repeat): execution token %d", d.ExecutionToken)
	case d.Outcome == wire.OutcomeReplayed && d.ReplayOf == "":
		return "a repeat, answered with the recorded decision"
	case d.Outcome == wire.OutcomeReplayed:
		s := "the same intent again: answered with decision " + d.ReplayOf
		if d.OriginalOutcome != "" {
			s += " (" + string(d.OriginalOutcome) + ")"
		}
		if a != nil {
			s += ", the authorization now " + string(a.State)
		}
		return s
	case d.Reason == wire.ReasonAlreadyExecuting && d.HeldBy != nil:
		return fmt.Sprintf("lost: executor %s holds the execution (token %d)", d.HeldBy.Executor, d.HeldBy.ExecutionToken)
	case d.Command == string(wire.CmdPropose) && d.Outcome == wire.OutcomeReserved && a != nil:
		s := fmt.Sprintf("%s · %s → %s", money(a.Amount), a.Operation, a.Target)
		if d.ForkOf != "" {
			s += ", forking " + d.ForkOf
		}
		return s
	case d.Command == string(wire.CmdBegin) && d.Outcome == wire.OutcomeExecuting && a != nil:
		return fmt.Sprintf("execution token %d", a.ExecutionToken)
	case d.Command == string(wire.CmdResolve) && d.Outcome == wire.OutcomeCommitted && a != nil:
		return "resolved committed, provider reference " + a.ExternalRef + evidence(a)
	case d.Command == string(wire.CmdResolve) && d.Outcome == wire.OutcomeCancelled:
		return "resolved cancelled: the provider did not execute it" + evidence(a)
	case d.Outcome == wire.OutcomeCommitted && a != nil:
		return "committed, provider reference " + a.ExternalRef
	case d.Outcome == wire.OutcomeInDoubt && a != nil && a.Reported != "":
		return "in doubt, reported: " + a.Reported
	case d.Outcome == wire.OutcomeInDoubt && a != nil && a.Detail != "":
		return "in doubt, reported: " + a.Detail
	case d.Outcome == wire.OutcomeInDoubt:
		return "in doubt: the use stays held until a resolve"
	case d.Outcome == wire.OutcomeExpired:
		return "expired: the reservation's deadline passed, the use is released"
	case d.Outcome == wire.OutcomeCancelled && a != nil && a.Detail != "":
		return "cancelled: " + a.Detail
	case d.Outcome == wire.OutcomeCancelled:
		return "cancelled"
	case d.Outcome == wire.OutcomeRevoked && d.Command == string(wire.CmdRevoke) && a == nil:
		return "mandate revoked: its unused authority ends"
	case d.Outcome == wire.OutcomeRevoked:
		return "reservation revoked with its mandate"
	case d.Reason != "":
		return string(d.Reason)
	}
	return string(d.Outcome)
}

// evidence is what a resolve recorded as the provider's answer.
func evidence(a *wire.AuthorizationView) string {
	if a == nil || a.Detail == "" {
		return ""
	}
	return "; evidence: " + a.Detail
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// outcomeClass is the class of an outcome's badge and its chart colour:
// what went through, what was refused, what waits for an operator.
func outcomeClass(outcome string) string {
	switch wire.Outcome(outcome) {
	case wire.OutcomeGranted, wire.OutcomeReserved, wire.OutcomeExecuting, wire.OutcomeCommitted:
		return "o-" + outcome
	case wire.OutcomeReplayed:
		return "o-replayed"
	case wire.OutcomeDenied, wire.OutcomeConflict, wire.OutcomeStale, wire.OutcomeRefused, wire.OutcomeRejected:
		return "o-" + outcome
	case wire.OutcomeInDoubt:
		return "o-in_doubt"
	}
	return "o-other"
}

// resultRow is one line of a recorded result as the timeline shows it.
type resultRow struct {
	Key, Value string
}

// resultRows reads a recorded result (a JSON object) as lines, nested
// members dotted, an amount by its currency (wire.FormatAmount): a member
// shaped as the contract's money ({"minor_units": 15000, "currency":
// "EUR"}), or a NAME_minor_units beside a currency, reads "150.00 EUR".
func resultRows(raw []byte) []resultRow {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []resultRow{{Key: "result", Value: string(raw)}}
	}
	var out []resultRow
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		obj, ok := v.(map[string]any)
		if !ok {
			out = append(out, resultRow{Key: cmp.Or(prefix, "result"), Value: scalar(v)})
			return
		}
		if s, ok := moneyOf(obj); ok {
			out = append(out, resultRow{Key: cmp.Or(prefix, "result"), Value: s})
			return
		}
		cur, _ := obj["currency"].(string)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			name := k
			if prefix != "" {
				name = prefix + "." + k
			}
			if n, ok := integer(obj[k]); ok && strings.HasSuffix(k, "_minor_units") && wire.ValidCurrency(cur) {
				out = append(out, resultRow{Key: strings.TrimSuffix(name, "_minor_units"), Value: wire.FormatAmount(n, cur)})
				continue
			}
			if k == "currency" && wire.ValidCurrency(cur) && hasMinorUnits(obj) {
				continue // read with its amount
			}
			walk(name, obj[k])
		}
	}
	walk("", v)
	return out
}

func moneyOf(obj map[string]any) (string, bool) {
	cur, ok := obj["currency"].(string)
	n, ok2 := integer(obj["minor_units"])
	if !ok || !ok2 || len(obj) != 2 || !wire.ValidCurrency(cur) {
		return "", false
	}
	return wire.FormatAmount(n, cur), true
}

func hasMinorUnits(obj map[string]any) bool {
	for k := range obj {
		if strings.HasSuffix(k, "_minor_units") {
			return true
		}
	}
	return false
}

func integer(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	return i, err == nil
}

func scalar(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return x
	case json.Number:
		return string(x)
	case bool:
		return strconv.FormatBool(x)
	}
	b, _ := json.Marshal(v)
	return string(b)
}
