package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// One search box finds any decision. What is typed is recognised by its
// shape, or named by a prefix (key:, intent:, executor:, ref:); a value
// of no particular shape is looked up as each of an idempotency key, an
// intent's run id, an executor and a provider's reference:
//
//	au_…                   an authorization id
//	3-1042                 a decision id (partition-sequence)
//	2@5531                 the record at partition 2, offset 5531 of the
//	                       proposals or the grants topic: the decisions
//	                       answering it
//	rq-2-5531-…            a gateway request id (it names its record)
//	acme/refund-case-1842  a mandate
//
// A search that finds one authorization opens its page; one decision
// without an authorization opens the decision; anything else lists what
// it found.

const (
	searchLimit    = 50
	maxSearchBytes = 512
)

// searchKind is a kind of value the box recognises.
type searchKind string

const (
	kindAuthorization searchKind = "authorization id"
	kindDecision      searchKind = "decision id"
	kindRecord        searchKind = "input record (partition@offset)"
	kindRequest       searchKind = "gateway request id"
	kindMandate       searchKind = "mandate (org/mandate_id)"
	kindKey           searchKind = "idempotency key"
	kindIntent        searchKind = "intent (run id)"
	kindExecutor      searchKind = "executor"
	kindRef           searchKind = "provider reference"
)

var (
	authorizationIDShape = regexp.MustCompile(`^au_[a-z2-7]{24}$`)
	decisionIDShape      = regexp.MustCompile(`^[0-9]+-[0-9]+$`)
	recordShape          = regexp.MustCompile(`^(?:(proposals|grants)[: ])?([0-9]+)@([0-9]+)$`)
	requestShape         = regexp.MustCompile(`^rq-([0-9]+)-([0-9]+)-[A-Za-z0-9_-]+$`)
)

// prefixes name a kind explicitly.
var prefixes = map[string]searchKind{
	"key:": kindKey, "intent:": kindIntent, "run:": kindIntent, "executor:": kindExecutor, "ref:": kindRef,
	"authorization:": kindAuthorization, "decision:": kindDecision,
}

// searchHit is one decision a search found, and why.
type searchHit struct {
	Kind searchKind
	Note string // for an intent: its step and action
	V    decisionView
}

// classify returns the kinds q is searched as, and q without a prefix.
func classify(q string) ([]searchKind, string) {
	for p, k := range prefixes {
		if rest, ok := strings.CutPrefix(q, p); ok {
			return []searchKind{k}, strings.TrimSpace(rest)
		}
	}
	switch {
	case authorizationIDShape.MatchString(q):
		return []searchKind{kindAuthorization}, q
	case decisionIDShape.MatchString(q):
		return []searchKind{kindDecision, kindKey}, q // a key may look like one
	case recordShape.MatchString(q):
		return []searchKind{kindRecord}, q
	case requestShape.MatchString(q):
		return []searchKind{kindRequest}, q
	}
	kinds := []searchKind{}
	if org, id, ok := strings.Cut(q, "/"); ok {
		if _, err := partitioner.NewMandateKey(org, id); err == nil {
			kinds = append(kinds, kindMandate)
		}
	}
	return append(kinds, kindKey, kindIntent, kindExecutor, kindRef), q
}

func (c *Console) searchPage(w http.ResponseWriter, r *http.Request, s session) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	switch {
	case q == "":
		c.fail(w, r, &s, http.StatusBadRequest, "Type what to find: an authorization id, an idempotency key, an intent's run id, "+
			"a decision id (3-1042), a record (2@5531), an executor, a provider's reference or a mandate (org/mandate_id).")
		return
	case len(q) > maxSearchBytes:
		c.fail(w, r, &s, http.StatusBadRequest, fmt.Sprintf("That is longer than anything the console searches (%d bytes).", maxSearchBytes))
		return
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	kinds, value := classify(q)
	op := c.src.Operator()
	var hits []searchHit
	add := func(k searchKind, es []sink.HistoryEntry) {
		for _, e := range es {
			h := searchHit{Kind: k, V: viewOf(e)}
			if d := h.V.D; k == kindIntent && d != nil && d.Binds != nil && d.Binds.Intent != nil {
				h.Note = "step " + d.Binds.Intent.Step + " · action " + d.Binds.Intent.Action
			}
			hits = append(hits, h)
		}
	}
	for _, k := range kinds {
		var es []sink.HistoryEntry
		var err error
		switch k {
		case kindMandate:
			org, id, _ := strings.Cut(value, "/")
			key, _ := partitioner.NewMandateKey(org, id)
			_, err = op.Inspect(ctx, key, 0)
			switch {
			case err == nil:
				http.Redirect(w, r, mandateURL(key), http.StatusSeeOther)
				return
			case errors.Is(err, sink.ErrNotFound):
				err = nil
			}
		case kindAuthorization:
			es, err = op.Search(ctx, sink.SearchAuthorization, value, searchLimit)
		case kindDecision:
			p, seq, ok := parseDecisionID(value)
			if !ok {
				break
			}
			var e *sink.HistoryEntry
			e, err = op.Decision(ctx, p, seq)
			if e != nil {
				es = append(es, *e)
			}
			if errors.Is(err, sink.ErrNotFound) {
				err = nil
			}
		case kindRecord, kindRequest:
			p, o, ok := recordOf(value)
			if !ok {
				break
			}
			es, err = op.Answering(ctx, p, o, searchLimit)
			topics := map[string]string{"proposals": c.src.Client.ProposalsTopic(), "grants": c.src.Client.GrantsTopic()}
			if m := recordShape.FindStringSubmatch(value); k == kindRecord && m != nil && m[1] != "" {
				es = onTopic(es, topics[m[1]]) // only the named topic's record
			}
			if k == kindRequest {
				es = onTopic(es, topics["proposals"]) // the gateway produces to the proposals topic
			}
		case kindKey:
			es, err = op.Search(ctx, sink.SearchIdempotency, value, searchLimit)
		case kindIntent:
			es, err = op.Search(ctx, sink.SearchIntent, value, searchLimit)
		case kindExecutor:
			es, err = op.Search(ctx, sink.SearchExecutor, value, searchLimit)
		case kindRef:
			es, err = op.Search(ctx, sink.SearchExternalRef, value, searchLimit)
		}
		if err != nil {
			c.historyUnavailable(w, r, &s, "search the decisions", err)
			return
		}
		add(k, es)
	}
	if to := searchTarget(hits, kinds); to != "" {
		http.Redirect(w, r, to, http.StatusSeeOther)
		return
	}
	data := map[string]any{"Q": q, "Kinds": kinds, "Hits": hits}
	status := http.StatusOK
	if len(hits) == 0 {
		status = http.StatusNotFound
		kept, err := op.HistoryKept(ctx)
		if err != nil {
			c.historyUnavailable(w, r, &s, "read the history's settings", err)
			return
		}
		data["Kept"] = kept
		health, err := op.PartitionHealth(ctx)
		if err == nil {
			var unpublished int64
			for _, h := range health {
				unpublished += h.Unpublished
			}
			data["Unpublished"] = unpublished
		}
	}
	c.render(w, r, status, "search", &s, data)
}

// searchTarget is where a search that found one thing goes: the page of
// the one authorization every hit is about (at the decision searched for,
// when one was), or the one decision found; "" to list the hits.
func searchTarget(hits []searchHit, kinds []searchKind) string {
	if len(hits) == 0 {
		return ""
	}
	first := hits[0].V
	for _, h := range hits[1:] {
		if h.V.Key != first.Key || h.V.AuthorizationID != first.AuthorizationID || (first.AuthorizationID == "" && h.V.ID != first.ID) {
			return ""
		}
	}
	if first.AuthorizationID == "" {
		return "/console/decisions/" + url.PathEscape(first.ID)
	}
	to := authorizationURL(first.Key, first.AuthorizationID)
	if len(kinds) > 0 && kinds[0] != kindAuthorization && len(hits) == 1 {
		to += "#d-" + first.ID
	}
	return to
}

// recordOf reads a record's partition and offset from "P@O", "topic P@O"
// or a gateway request id.
func recordOf(v string) (int32, int64, bool) {
	var ps, os string
	if m := recordShape.FindStringSubmatch(v); m != nil {
		ps, os = m[2], m[3]
	} else if m := requestShape.FindStringSubmatch(v); m != nil {
		ps, os = m[1], m[2]
	} else {
		return 0, 0, false
	}
	p, err1 := strconv.ParseInt(ps, 10, 32)
	o, err2 := strconv.ParseInt(os, 10, 64)
	return int32(p), o, err1 == nil && err2 == nil
}

// onTopic keeps the decisions answering a record of one topic.
func onTopic(es []sink.HistoryEntry, topic string) []sink.HistoryEntry {
	var out []sink.HistoryEntry
	for _, e := range es {
		if d, err := wire.ParseDecision(e.Payload); err == nil && d.Source != nil && d.Source.Topic == topic {
			out = append(out, e)
		}
	}
	return out
}

func (c *Console) queryContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
}

func mandateURL(k partitioner.MandateKey) string {
	return "/console/mandates/" + url.PathEscape(k.Org) + "/" + url.PathEscape(k.MandateID)
}
