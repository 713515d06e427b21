package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// ---- the in-doubt queue

func (c *Console) inDoubtPage(w http.ResponseWriter, r *http.Request, s session) {
	org := r.URL.Query().Get("org")
	if org != "" && !partitioner.ValidOrg(org) {
		c.fail(w, r, &s, http.StatusBadRequest, fmt.Sprintf("%q is not an org id.", org))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	rows, err := c.src.Operator().InDoubt(ctx, 0, org, c.cfg.InDoubtLimit)
	if err != nil {
		c.unavailable(w, r, &s, "read the in-doubt authorizations", err)
		return
	}
	var oldest time.Duration
	for _, row := range rows {
		oldest = max(oldest, row.Age)
	}
	c.render(w, r, http.StatusOK, "indoubt", &s, map[string]any{"Rows": rows, "Org": org, "Oldest": oldest,
		"Limited": len(rows) == c.cfg.InDoubtLimit, "Limit": c.cfg.InDoubtLimit})
}

// ---- reconcile

// reconcileView is what the reconcile form shows of one authorization.
type reconcileView struct {
	Key      partitioner.MandateKey
	Auth     *lifecycle.Authorization
	Signing  sink.SigningMode
	KeyID    string // the signer's key id, "" when the console holds none for the org
	CanSign  bool
	Blocked  string // why it cannot be resolved from here, "" when it can
	Form     url.Values
	Problems []string
}

func (c *Console) reconcileView(ctx context.Context, r *http.Request) (*reconcileView, int, string) {
	key, err := partitioner.NewMandateKey(r.PathValue("org"), r.PathValue("mandate"))
	if err != nil {
		return nil, http.StatusBadRequest, err.Error()
	}
	id := r.PathValue("authorization")
	a, err := c.src.Operator().Authorization(ctx, key, id)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		return nil, http.StatusNotFound, fmt.Sprintf("No authorization %s under %s.", id, key)
	case err != nil:
		c.log.Warn().Err(err).Msg("console: read an authorization")
		return nil, http.StatusServiceUnavailable, "PostgreSQL refused the read or did not answer (the gateway's log says which); try again."
	}
	modes, err := sink.SigningModes(ctx, c.src.Control)
	if err != nil {
		c.log.Warn().Err(err).Msg("console: read grant_signing")
		return nil, http.StatusServiceUnavailable, "PostgreSQL refused the read or did not answer (the gateway's log says which); try again."
	}
	v := &reconcileView{Key: key, Auth: a, Signing: modes[key.Org], Form: url.Values{}}
	if v.Signing == "" {
		v.Signing = sink.SigningOff
	}
	if sg := c.cfg.Signers[key.Org]; sg != nil {
		v.KeyID, v.CanSign = sg.KeyID, true
	}
	switch {
	case a.State != wire.StateInDoubt:
		v.Blocked = fmt.Sprintf("This authorization is %s, not in doubt: only an in-doubt execution is resolved.", a.State)
	case v.Signing == sink.SigningRequired && !v.CanSign:
		v.Blocked = fmt.Sprintf("Org %s requires signed resolves and this gateway holds no signing key for it "+
			"(--console-signing-key %s=KEY_ID:FILE); use mandatectl reconcile --signing-key-file.", key.Org, key.Org)
	}
	return v, http.StatusOK, ""
}

func (c *Console) reconcilePage(w http.ResponseWriter, r *http.Request, s session) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	v, status, msg := c.reconcileView(ctx, r)
	if v == nil {
		c.fail(w, r, &s, status, msg)
		return
	}
	c.render(w, r, http.StatusOK, "reconcile", &s, map[string]any{"V": v})
}

// maxEvidence bounds the evidence an operator types (the wire bounds free
// text; this keeps the form's answer readable).
const maxEvidence = 1000

func (c *Console) reconcile(w http.ResponseWriter, r *http.Request, s session) {
	if !c.checkForm(w, r, s) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	v, status, msg := c.reconcileView(ctx, r)
	if v == nil {
		c.fail(w, r, &s, status, msg)
		return
	}
	v.Form = r.PostForm
	outcome := r.PostFormValue("outcome")
	ref := strings.TrimSpace(r.PostFormValue("external_ref"))
	evidence := strings.TrimSpace(r.PostFormValue("evidence"))
	switch {
	case v.Blocked != "":
		v.Problems = append(v.Problems, v.Blocked)
	case outcome != string(wire.ResolveCommitted) && outcome != string(wire.ResolveCancelled):
		v.Problems = append(v.Problems, "Choose what the provider says: committed (it executed) or cancelled (it did not, and will not).")
	case outcome == string(wire.ResolveCommitted) && ref == "":
		v.Problems = append(v.Problems, "A committed execution needs the provider's reference.")
	case outcome == string(wire.ResolveCancelled) && ref != "":
		v.Problems = append(v.Problems, "A cancelled execution has no provider reference: leave it empty.")
	case evidence == "":
		v.Problems = append(v.Problems, "Say what the provider said (the evidence is recorded with the decision).")
	case len(evidence) > maxEvidence:
		v.Problems = append(v.Problems, fmt.Sprintf("The evidence is longer than %d bytes.", maxEvidence))
	}
	resolve := client.Resolve{AuthorizationRef: client.AuthorizationRef{Org: v.Key.Org, MandateID: v.Key.MandateID, AuthorizationID: v.Auth.Key.ID},
		Outcome: wire.ResolveOutcome(outcome), ExternalRef: ref, Evidence: evidence, ExecutionToken: v.Auth.ExecutionToken,
		Reconciler: "console:" + s.token.ID} // who resolved it, kept with the authorization (resolved_by)
	var value []byte
	if len(v.Problems) == 0 {
		var err error
		// The same record mandatectl reconcile sends.
		value, _, err = client.Record(resolve, c.cfg.Signers[v.Key.Org])
		var inv *client.InvalidCommandError
		switch {
		case errors.As(err, &inv):
			v.Problems = append(v.Problems, fmt.Sprintf("The resolve is invalid (%s): %s", inv.Reason, inv.Detail))
		case err != nil:
			v.Problems = append(v.Problems, err.Error())
		}
	}
	if len(v.Problems) > 0 {
		c.render(w, r, http.StatusUnprocessableEntity, "reconcile", &s, map[string]any{"V": v})
		return
	}
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.cfg.DecisionTimeout)
	defer wcancel()
	src, err := c.src.Client.SubmitExact(wctx, v.Key, value)
	log := c.log.With().Str("operator", s.token.ID).Str("mandate", v.Key.String()).Str("authorization_id", v.Auth.Key.ID).
		Str("outcome", outcome).Bool("signed", c.cfg.Signers[v.Key.Org] != nil).Logger()
	if err != nil {
		log.Warn().Err(err).Msg("console: the resolve was not acknowledged")
		c.fail(w, r, &s, http.StatusServiceUnavailable, "Kafka did not acknowledge the resolve in time; it may still be decided. "+
			"Reload the in-doubt queue before sending it again.")
		return
	}
	log.Info().Str("topic", src.Topic).Int32("partition", src.Partition).Int64("offset", src.Offset).Msg("console: resolve sent")
	d, err := c.src.Client.Await(wctx, src)
	data := map[string]any{"V": v, "Source": src, "Outcome": outcome}
	if err != nil {
		data["Pending"] = true
		c.render(w, r, http.StatusAccepted, "resolved", &s, data)
		return
	}
	data["Decision"] = d
	data["Resolved"] = d.Outcome == wire.Outcome(outcome) || d.State() == wire.AuthState(outcome)
	pretty, _ := json.MarshalIndent(json.RawMessage(d.Raw), "", "  ")
	data["Raw"] = string(pretty)
	c.render(w, r, http.StatusOK, "resolved", &s, data)
}

// ---- a mandate

// mandateLookup keeps the first console's lookup (/console/mandates?key=)
// working: it is a search now.
func (c *Console) mandateLookup(w http.ResponseWriter, r *http.Request, s session) {
	http.Redirect(w, r, "/console/search?q="+url.QueryEscape(r.URL.Query().Get("key")), http.StatusSeeOther)
}

// lineage is one chain of forks: an authorization and those that forked it
// in turn, oldest first.
type lineage []string

func (c *Console) mandatePage(w http.ResponseWriter, r *http.Request, s session) {
	key, err := partitioner.NewMandateKey(r.PathValue("org"), r.PathValue("mandate"))
	if err != nil {
		c.fail(w, r, &s, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	snap, err := c.src.Operator().Inspect(ctx, key, c.cfg.Authorizations)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		c.fail(w, r, &s, http.StatusNotFound, fmt.Sprintf("No mandate %s.", key))
		return
	case err != nil:
		c.unavailable(w, r, &s, "read the mandate", err)
		return
	}
	states := map[wire.AuthState]int{}
	for _, a := range snap.Authorizations {
		states[a.State]++
	}
	m := snap.Mandate
	left := max(m.UsesAllowed-m.UsesHeld-m.UsesSpent, 0)
	var slots []string // one square per use, when they fit on a line
	if m.UsesAllowed <= 40 {
		for range m.UsesSpent {
			slots = append(slots, "spent")
		}
		for range m.UsesHeld - m.UsesInDoubt {
			slots = append(slots, "held")
		}
		for range m.UsesInDoubt {
			slots = append(slots, "in_doubt")
		}
		for range left {
			slots = append(slots, "free")
		}
	}
	data := map[string]any{"Key": key, "M": m, "Left": left, "Slots": slots, "Auths": snap.Authorizations,
		"States": states, "Lineages": lineages(snap.Authorizations), "Limited": len(snap.Authorizations) == c.cfg.Authorizations,
		"Limit": c.cfg.Authorizations}
	// Its latest decisions; the page stands without them (the history
	// page says why they cannot be read).
	if latest, err := c.src.Operator().MandateHistory(ctx, key, nil, latestDecisions); err == nil {
		data["Latest"] = views(latest)
	} else {
		c.log.Warn().Err(err).Str("mandate", key.String()).Msg("console: read a mandate's latest decisions")
		data["LatestError"] = true
	}
	c.render(w, r, http.StatusOK, "mandate", &s, data)
}

// lineages are the fork chains among auths: each chain starts at an
// authorization that forks nothing shown and follows fork_of forward.
func lineages(auths []*lifecycle.Authorization) []lineage {
	next := map[string][]string{}
	forked := map[string]bool{}
	for _, a := range auths {
		if a.ForkOf != "" {
			next[a.ForkOf] = append(next[a.ForkOf], a.Key.ID)
			forked[a.Key.ID] = true
		}
	}
	var out []lineage
	var walk func(id string, path lineage)
	walk = func(id string, path lineage) {
		path = append(slices.Clone(path), id)
		if len(next[id]) == 0 {
			out = append(out, path)
			return
		}
		for _, n := range next[id] {
			walk(n, path)
		}
	}
	roots := []string{}
	for id := range next {
		if !forked[id] {
			roots = append(roots, id)
		}
	}
	slices.Sort(roots)
	for _, id := range roots {
		walk(id, nil)
	}
	return out
}

// ---- partitions

// partitionView is one partition's row.
type partitionView struct {
	Row                     sink.PartitionRow
	Health                  sink.PartitionHealth
	ProposalsEnd, GrantsEnd int64
	ProposalsLag, GrantsLag int64
	LagKnown                bool
}

func (c *Console) partitionsPage(w http.ResponseWriter, r *http.Request, s session) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	op := c.src.Operator()
	rows, err := op.Partitions(ctx)
	if err != nil {
		c.unavailable(w, r, &s, "read the partitions", err)
		return
	}
	health, err := op.PartitionHealth(ctx)
	if err != nil {
		c.unavailable(w, r, &s, "read the partitions' backlogs", err)
		return
	}
	proposals, grants := c.src.Client.ProposalsTopic(), c.src.Client.GrantsTopic()
	ends, lagErr := c.src.Client.EndOffsets(ctx, proposals, grants)
	views := make([]partitionView, 0, len(rows))
	var total partitionView
	for _, p := range rows {
		v := partitionView{Row: p, Health: health[p.Partition]}
		pe, ok1 := ends[proposals][p.Partition]
		ge, ok2 := ends[grants][p.Partition]
		if ok1 && ok2 {
			v.LagKnown = true
			v.ProposalsEnd, v.GrantsEnd = pe, ge
			v.ProposalsLag, v.GrantsLag = max(pe-p.ProposalsOffset, 0), max(ge-p.GrantsOffset, 0)
		}
		total.ProposalsLag += v.ProposalsLag
		total.GrantsLag += v.GrantsLag
		total.Health.Unpublished += v.Health.Unpublished
		total.Health.InDoubt += v.Health.InDoubt
		total.Health.Parked += v.Health.Parked
		views = append(views, v)
	}
	data := map[string]any{"Rows": views, "Total": total}
	if lagErr != nil {
		c.log.Warn().Err(lagErr).Msg("console: list the topics' end offsets")
		data["LagError"] = "Kafka did not answer for the topics' end offsets: lag is not shown."
	}
	c.render(w, r, http.StatusOK, "partitions", &s, data)
}

// ---- the last verify

// verifyReport is the part of verify's JSON report (verify.Report) the
// page shows.
type verifyReport struct {
	Partitions []verifyPartition `json:"partitions"`
	Breaks     []struct {
		Partition int32  `json:"partition"`
		Sequence  int64  `json:"sequence"`
		Topic     string `json:"topic"`
		Offset    int64  `json:"offset"`
		Kind      string `json:"kind"`
		Detail    string `json:"detail"`
	} `json:"breaks"`
	Drifts []map[string]any `json:"drifts"`
}

type verifyPartition struct {
	Partition   int32  `json:"partition"`
	From        int64  `json:"from_sequence"`
	Complete    bool   `json:"complete"`
	Decisions   int64  `json:"decisions"`
	DeadLetters int64  `json:"dead_letters"`
	Parked      int64  `json:"parked"`
	Mandates    int64  `json:"mandates"`
	Head        string `json:"head"` // partition:sequence:hash:decisions offset:dead-letter offset
}

// HeadSequence and HeadHash read the head checkpoint.
func (p verifyPartition) HeadSequence() string { return p.headPart(1) }
func (p verifyPartition) HeadHash() string     { return p.headPart(2) }

func (p verifyPartition) headPart(i int) string {
	parts := strings.Split(p.Head, ":")
	if len(parts) <= i {
		return ""
	}
	return parts[i]
}

func (c *Console) verifyPage(w http.ResponseWriter, r *http.Request, s session) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.QueryTimeout)
	defer cancel()
	run, err := sink.LastVerifyRun(ctx, c.src.Control)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		c.render(w, r, http.StatusOK, "verify", &s, map[string]any{})
		return
	case err != nil:
		c.unavailable(w, r, &s, "read the last verify run", err)
		return
	}
	data := map[string]any{"Run": run, "Age": c.cfg.Now().Sub(run.FinishedAt)}
	if run.Report != nil {
		var rep verifyReport
		if err := json.Unmarshal(run.Report, &rep); err == nil {
			data["Report"] = rep
		}
	}
	c.render(w, r, http.StatusOK, "verify", &s, data)
}

func (c *Console) unavailable(w http.ResponseWriter, r *http.Request, s *session, what string, err error) {
	c.log.Warn().Err(err).Str("path", r.URL.Path).Msg("console: cannot " + what)
	c.fail(w, r, s, http.StatusServiceUnavailable, "Cannot "+what+" now: PostgreSQL refused the read or did not answer (the gateway's log says which). Try again.")
}

// ---- template functions

func funcs(now func() time.Time) template.FuncMap {
	return template.FuncMap{
		"age": fmtAge,
		"since": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return fmtAge(now().Sub(t))
		},
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"dash": func(s string) string {
			if s == "" {
				return "—"
			}
			return s
		},
		"money": wire.FormatAmount, // by the currency's exponent, as mandatectl prints it
		"json": func(b []byte) string {
			if len(b) == 0 {
				return ""
			}
			return string(b)
		},
		"short": func(s string, n int) string {
			if len(s) <= n {
				return s
			}
			return s[:n] + "…"
		},
		"join":             strings.Join,
		"lineage":          func(l lineage) string { return strings.Join(l, " → ") },
		"mandateURL":       mandateURL,
		"authorizationURL": authorizationURL,
		"historyURL":       func(k partitioner.MandateKey) string { return mandateURL(k) + "/history" },
		"decisionURL":      func(id string) string { return "/console/decisions/" + url.PathEscape(id) },
		"outcomeClass":     outcomeClass,
		"f1":               func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
		"reconcileURL": func(k partitioner.MandateKey, id string) string {
			return "/console/reconcile/" + url.PathEscape(k.Org) + "/" + url.PathEscape(k.MandateID) + "/" + url.PathEscape(id)
		},
		"terminal": func(st wire.AuthState) bool { return st.Terminal() },
		"dur":      func(d time.Duration) string { return d.String() },
		"span": func(d time.Duration) string { // a retention: 7 days, 36h0m0s
			if d > 0 && d%(24*time.Hour) == 0 {
				n := int64(d / (24 * time.Hour))
				return fmt.Sprintf("%d day%s", n, plural(n))
			}
			return d.String()
		},
		"checked": func(v url.Values, name, value string) bool {
			return v.Get(name) == value
		},
	}
}

// fmtAge is a duration as an operator reads it: 45s, 12m 03s, 5h 02m, 3d 4h.
func fmtAge(d time.Duration) string {
	d = max(d, 0).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}
