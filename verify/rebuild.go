package verify

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/mandated/mandated/wire"
)

// rebuild is the state the decisions alone describe: the one
// implementation of "state from the log", which verify compares with
// PostgreSQL and Recover writes to it. It reads only the views decisions
// carry (an authorization's state and version, a mandate's counters and
// terms) and what they bound, never their outcome or reason, so decisions
// with outcomes and reasons it has never heard of rebuild the same way.
type rebuild struct {
	mandates map[string]*rbMandate
	history  []Drift
	toCheck  map[string]string // mandate key → the first decision of the current group that changed it
	order    []string
}

type rbMandate struct {
	view      wire.MandateView
	viewAt    string    // the decision that last showed its counters
	viewTime  time.Time // when the decision that last changed its version was decided
	firstTime time.Time // when the first decision that showed it was decided
	complete  bool      // its history starts at its first grant: counters can be added up from its authorizations
	auths     map[string]*rbAuth
}

type rbAuth struct {
	state         wire.AuthState
	version       int64
	amount        int64
	spentOnCancel bool // cancelled under a mandate that spends on cancel
	at            string
	view          wire.AuthorizationView // the latest view
	first         string                 // the first decision that showed it (the reservation)
}

func newRebuild() *rebuild {
	return &rebuild{mandates: map[string]*rbMandate{}, toCheck: map[string]string{}}
}

// apply folds one decision into the rebuild.
func (rb *rebuild) apply(d *wire.Decision) {
	// A command's consequences (reservations revoked with their mandate)
	// follow its answer, which already shows the final counters: the
	// counters are checked against the authorizations once the group ends,
	// at the next decision that answers a record or a deadline.
	if d.Source != nil || d.Command == wire.CommandTimer {
		rb.flushChecks()
	}
	m := rb.mandates[d.MandateKey]
	if m == nil && (d.Mandate != nil || d.Authorization != nil) {
		m = &rbMandate{auths: map[string]*rbAuth{}, firstTime: d.DecidedAt}
		m.complete = d.Mandate != nil && d.Mandate.Version == 1 && d.Outcome == wire.OutcomeGranted
		rb.mandates[d.MandateKey] = m
	}
	if m == nil {
		return
	}
	if v := d.Authorization; v != nil {
		a := m.auths[v.ID]
		if a == nil {
			a = &rbAuth{first: d.DecisionID}
			m.auths[v.ID] = a
		}
		if v.Version >= a.version {
			if v.State == wire.StateCancelled && a.state != wire.StateCancelled && d.Mandate != nil {
				a.spentOnCancel = !d.Mandate.ReleaseCancel
			}
			a.state, a.version, a.amount, a.at = v.State, v.Version, v.Amount.MinorUnits, d.DecisionID
			a.view = *v
		}
	}
	if d.Mandate != nil && d.Mandate.Version >= m.view.Version {
		if d.Mandate.Version > m.view.Version {
			m.viewTime = d.DecidedAt
		}
		m.view, m.viewAt = *d.Mandate, d.DecisionID
		if _, ok := rb.toCheck[d.MandateKey]; !ok {
			rb.toCheck[d.MandateKey] = d.DecisionID
			rb.order = append(rb.order, d.MandateKey)
		}
	}
}

// counters adds a mandate's counters up from its authorizations.
func (m *rbMandate) counters() (held, spent, doubt, amtHeld, amtSpent int64) {
	for _, a := range m.auths {
		switch {
		case a.state.HoldsUse():
			held++
			amtHeld += a.amount
			if a.state == wire.StateInDoubt {
				doubt++
			}
		case a.state == wire.StateCommitted, a.state == wire.StateCancelled && a.spentOnCancel:
			spent++
			amtSpent += a.amount
		}
	}
	return
}

// flushChecks compares, for every mandate the last group changed, the
// counters its decision shows with what its authorizations add up to.
func (rb *rebuild) flushChecks() {
	for _, k := range rb.order {
		m, at := rb.mandates[k], rb.toCheck[k]
		if !m.complete {
			continue
		}
		held, spent, doubt, amtHeld, amtSpent := m.counters()
		for _, f := range []struct {
			name       string
			view, auth int64
		}{
			{"uses_held", m.view.UsesHeld, held},
			{"uses_spent", m.view.UsesSpent, spent},
			{"uses_in_doubt", m.view.UsesInDoubt, doubt},
			{"amount_held_minor_units", m.view.AmountHeld, amtHeld},
			{"amount_spent_minor_units", m.view.AmountSpent, amtSpent},
		} {
			if f.view != f.auth {
				rb.history = append(rb.history, Drift{Kind: "history", Mandate: k, Field: f.name,
					History: strconv.FormatInt(f.view, 10), Database: strconv.FormatInt(f.auth, 10), Decision: at})
			}
		}
	}
	clear(rb.toCheck)
	rb.order = rb.order[:0]
}

// compare reports every difference between the rebuild and PostgreSQL.
// complete says the history read starts at the partition's first record,
// so a row PostgreSQL has and the history lacks is drift too.
func (rb *rebuild) compare(s *snapshot, complete bool) []Drift {
	var out []Drift
	keys := make([]string, 0, len(rb.mandates))
	for k := range rb.mandates {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if s.MovedAway[k] {
			continue // it lives on another partition now: compared there
		}
		m := rb.mandates[k]
		db, ok := s.Mandates[k]
		if !ok {
			out = append(out, Drift{Kind: "database", Mandate: k, Field: "mandate", History: "exists", Database: "missing", Decision: m.viewAt})
			continue
		}
		if m.viewAt != "" {
			v := m.view
			for _, f := range []struct {
				name    string
				hist, d int64
			}{
				{"version", v.Version, db.Version},
				{"terms_version", v.TermsVersion, db.TermsVersion},
				{"uses_allowed", v.UsesAllowed, db.UsesAllowed},
				{"uses_held", v.UsesHeld, db.UsesHeld},
				{"uses_spent", v.UsesSpent, db.UsesSpent},
				{"uses_in_doubt", v.UsesInDoubt, db.UsesInDoubt},
				{"amount_held_minor_units", v.AmountHeld, db.AmountHeld},
				{"amount_spent_minor_units", v.AmountSpent, db.AmountSpent},
			} {
				if f.hist != f.d {
					out = append(out, Drift{Kind: "database", Mandate: k, Field: f.name,
						History: strconv.FormatInt(f.hist, 10), Database: strconv.FormatInt(f.d, 10), Decision: m.viewAt})
				}
			}
			if string(v.Status) != db.Status {
				out = append(out, Drift{Kind: "database", Mandate: k, Field: "status", History: string(v.Status), Database: db.Status, Decision: m.viewAt})
			}
		}
		ids := make([]string, 0, len(m.auths))
		for id := range m.auths {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			a := m.auths[id]
			da, ok := s.Auths[authKey(k, id)]
			switch {
			case !ok:
				out = append(out, Drift{Kind: "database", Mandate: k, Authorization: id, Field: "authorization", History: string(a.state), Database: "missing", Decision: a.at})
			case string(a.state) != da.State:
				out = append(out, Drift{Kind: "database", Mandate: k, Authorization: id, Field: "state", History: string(a.state), Database: da.State, Decision: a.at})
			case a.version != da.Version:
				out = append(out, Drift{Kind: "database", Mandate: k, Authorization: id, Field: "version",
					History: strconv.FormatInt(a.version, 10), Database: strconv.FormatInt(da.Version, 10), Decision: a.at})
			}
		}
	}
	if complete {
		var extra []Drift
		for k := range s.Mandates {
			if rb.mandates[k] == nil && !s.MovedIn[k] {
				extra = append(extra, Drift{Kind: "database", Mandate: k, Field: "mandate", History: "missing", Database: "exists", Decision: "(none)"})
			}
		}
		for ak, da := range s.Auths {
			var mk, id string
			for i := len(ak) - 1; i >= 0; i-- {
				if ak[i] == '#' {
					mk, id = ak[:i], ak[i+1:]
					break
				}
			}
			if m := rb.mandates[mk]; m != nil && m.auths[id] == nil && !s.MovedIn[mk] {
				extra = append(extra, Drift{Kind: "database", Mandate: mk, Authorization: id, Field: "authorization",
					History: "missing", Database: fmt.Sprintf("%s v%d", da.State, da.Version), Decision: "(none)"})
			}
		}
		slices.SortFunc(extra, func(a, b Drift) int {
			return cmp.Or(cmp.Compare(a.Mandate, b.Mandate), cmp.Compare(a.Authorization, b.Authorization))
		})
		out = append(out, extra...)
	}
	return out
}
