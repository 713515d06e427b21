package lifecycle

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// Mandate is one grant of authority and its running counters.
type Mandate struct {
	Key       partitioner.MandateKey
	Partition int32
	Version   int64
	// TermsVersion is the version the mandate's last grant made (0 when
	// that grant was decided before migration 0020). A grant bound to a
	// version (every signed grant is) must be based on it or later.
	TermsVersion     int64
	Status           wire.MandateStatus
	Operations       []string
	Targets          []string // empty: any target
	Currency         string
	MaxAmount        int64 // per use, minor units
	TotalLimit       int64 // cap on held + spent amount; 0: none
	UsesAllowed      int64
	UsesHeld         int64 // reserved, executing or in doubt
	UsesSpent        int64 // committed, or cancelled without release
	UsesInDoubt      int64 // the in-doubt part of UsesHeld
	AmountHeld       int64
	AmountSpent      int64
	ValidFrom        time.Time
	ValidUntil       time.Time // zero: no end
	ReleaseOnCancel  bool
	HoldWindow       time.Duration
	ExecutionTimeout time.Duration
	LastAuthID       string // the authorization that most recently took a use
	// Executions counts the begins that won on this mandate: the last
	// execution token handed out. Tokens are monotonic per mandate, but
	// executions of a mandate of several uses overlap, so a store
	// downstream fences per authorization (per mandate only where the
	// mandate has one use): see docs/design.md, "The executor boundary".
	Executions int64
	CreatedAt  time.Time
	UpdatedAt  time.Time

	// LoadedVersion is the version read from storage (0 when new); the sink
	// writes a change only if storage still holds it.
	LoadedVersion int64
	Dirty         bool
}

// Check verifies the invariants the database also enforces.
func (m *Mandate) Check() error {
	switch {
	case m.UsesHeld < 0 || m.UsesSpent < 0 || m.UsesInDoubt < 0 || m.AmountHeld < 0 || m.AmountSpent < 0:
		return fmt.Errorf("mandate %s: negative counter %+v", m.Key, *m)
	case m.UsesHeld+m.UsesSpent > m.UsesAllowed:
		return fmt.Errorf("mandate %s: held %d + spent %d uses exceed the %d allowed", m.Key, m.UsesHeld, m.UsesSpent, m.UsesAllowed)
	case m.UsesInDoubt > m.UsesHeld:
		return fmt.Errorf("mandate %s: %d in doubt but only %d held", m.Key, m.UsesInDoubt, m.UsesHeld)
	case m.TotalLimit > 0 && m.AmountHeld+m.AmountSpent > m.TotalLimit:
		return fmt.Errorf("mandate %s: held %d + spent %d exceed the total limit %d", m.Key, m.AmountHeld, m.AmountSpent, m.TotalLimit)
	}
	return nil
}

// AuthKey identifies an authorization. It includes the mandate, so an
// authorization id can only ever be found through its own mandate (and
// through its own org).
type AuthKey struct {
	Mandate partitioner.MandateKey
	ID      string
}

// Authorization is one reserved use of a mandate and its lifecycle.
type Authorization struct {
	Key               AuthKey
	State             wire.AuthState
	Version           int64
	Operation         string
	Target            string
	Amount            int64
	Currency          string
	IdempotencyKey    string
	MandateVersion    int64 // the mandate version the reservation made
	Deadline          time.Time
	ExecutionDeadline time.Time // zero until begin
	Executor          string    // the executor of the begin that won (column begin_key)
	ExecutionToken    int64     // its token; 0 until begin
	ExternalRef       string
	Result            []byte // the winning commit's result (a JSON object), nil when none
	// Resolved is set when reconciliation settled the execution: the
	// executor's token acts no more (a paused executor waking after it is
	// refused, whatever it says).
	Resolved bool
	Detail   string
	// Reported is what was said when the execution went in doubt (the
	// executor's report_unknown detail, or the execution timeout's), kept
	// through the resolve; ResolvedBy is the resolve's reconciler.
	Reported   string
	ResolvedBy string
	DecisionID string // the decision that reserved it
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ForkOf     string // the authorization of the same intent this one superseded

	LoadedVersion int64
	Dirty         bool
}

// IdemScope is the scope of an idempotency key: one mandate (org and
// mandate id), one operation. The mandate bounds it because a mandate has
// one home partition, so one partition's single writer decides every use
// of a key in one database transaction, on one database or on a shard map
// alike (docs/design.md, "Idempotency"); the same key on two mandates is two
// intents.
type IdemScope struct {
	Org       string
	MandateID string
	Operation string
	Key       string
}

// Idempotency scopes of grantor commands. The colon is outside the
// operation grammar, so no agent's proposal can ever share (and so block or
// replay) a grantor's key.
const (
	GrantScope  = "grantor:grant"
	RevokeScope = "grantor:revoke"
)

// ScopeOf returns the idempotency scope a command binds, if it binds one:
// a propose always; a grant or revoke when it carries a key.
func ScopeOf(c *wire.Command) (IdemScope, bool) {
	switch {
	case c.Type == wire.CmdPropose:
		return IdemScope{Org: c.Key.Org, MandateID: c.Key.MandateID, Operation: c.Propose.Operation, Key: c.IdempotencyKey}, true
	case c.Type == wire.CmdGrant && c.IdempotencyKey != "":
		return IdemScope{Org: c.Key.Org, MandateID: c.Key.MandateID, Operation: GrantScope, Key: c.IdempotencyKey}, true
	case c.Type == wire.CmdRevoke && c.IdempotencyKey != "":
		return IdemScope{Org: c.Key.Org, MandateID: c.Key.MandateID, Operation: RevokeScope, Key: c.IdempotencyKey}, true
	}
	return IdemScope{}, false
}

// IdemRecord binds an idempotency key to the first decision about its intent.
type IdemRecord struct {
	Scope           IdemScope
	Fingerprint     []byte
	Mandate         partitioner.MandateKey // the scope's mandate
	AuthorizationID string                 // empty when the answer was a denial
	DecisionID      string
	Outcome         wire.Outcome
	Reason          wire.Reason
	CreatedAt       time.Time
	ExpiresAt       time.Time

	New bool // created in this batch
}

// State is the working set of one batch on one partition: what the sink
// loaded for the batch's commands, changed in memory as they are decided.
// A key that was looked up and not found is simply absent.
type State struct {
	Partition int32
	Epoch     int64
	NextSeq   int64 // the outbox sequence the next decision takes

	Mandates map[partitioner.MandateKey]*Mandate
	Auths    map[AuthKey]*Authorization
	Idem     map[IdemScope]*IdemRecord
	Intents  map[IntentScope]*IntentRecord

	// Retention returns how long an org's idempotency keys are kept.
	Retention func(org string) time.Duration
	// Replay holds the possible-replay settings of the orgs whose
	// proposals the batch decides; an org that is absent has them off.
	Replay map[string]ReplaySetting
}

// NewState returns an empty working set.
func NewState(partition int32, epoch, nextSeq int64, retention func(string) time.Duration) *State {
	return &State{
		Partition: partition, Epoch: epoch, NextSeq: nextSeq,
		Mandates:  map[partitioner.MandateKey]*Mandate{},
		Auths:     map[AuthKey]*Authorization{},
		Idem:      map[IdemScope]*IdemRecord{},
		Intents:   map[IntentScope]*IntentRecord{},
		Retention: retention,
	}
}

// AuthorizationID derives the id of the authorization a propose record
// creates from where the record sits, so deciding the same record again
// (after a failed commit) names the same authorization.
func AuthorizationID(key partitioner.MandateKey, src wire.Source) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%d\x00%d", key, src.Topic, src.Partition, src.Offset)))
	return "au_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:15]))
}

// heldAuths returns the loaded authorizations of a mandate in a given
// state, ordered by id so that decisions are deterministic.
func (st *State) heldAuths(key partitioner.MandateKey, state wire.AuthState) []*Authorization {
	var out []*Authorization
	for k, a := range st.Auths {
		if k.Mandate == key && a.State == state {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.ID < out[j].Key.ID })
	return out
}

// newDecision stamps a decision with the next outbox sequence.
func (st *State) newDecision(key partitioner.MandateKey, command string, now time.Time) *wire.Decision {
	seq := st.NextSeq
	st.NextSeq++
	return &wire.Decision{
		V:          wire.SchemaVersion,
		DecisionID: wire.DecisionID(st.Partition, seq),
		Sequence:   seq,
		Partition:  st.Partition,
		Epoch:      st.Epoch,
		MandateKey: key.String(),
		Org:        key.Org,
		MandateID:  key.MandateID,
		Command:    command,
		DecidedAt:  now,
	}
}

func authView(a *Authorization) *wire.AuthorizationView {
	if a == nil {
		return nil
	}
	v := &wire.AuthorizationView{
		ID: a.Key.ID, State: a.State, Version: a.Version, Operation: a.Operation, Target: a.Target,
		Amount:         wire.Money{MinorUnits: a.Amount, Currency: a.Currency},
		IdempotencyKey: a.IdempotencyKey, MandateVersion: a.MandateVersion,
		Deadline: a.Deadline, ExternalRef: a.ExternalRef, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
		Executor: a.Executor, ExecutionToken: a.ExecutionToken, Result: a.Result,
		Detail: a.Detail, Resolved: a.Resolved, Reported: a.Reported, ResolvedBy: a.ResolvedBy,
	}
	v.ForkOf = a.ForkOf
	if !a.ExecutionDeadline.IsZero() {
		t := a.ExecutionDeadline
		v.ExecutionDeadline = &t
	}
	return v
}

func mandateView(m *Mandate) *wire.MandateView {
	if m == nil {
		return nil
	}
	v := &wire.MandateView{
		Version: m.Version, TermsVersion: m.TermsVersion, Status: m.Status, UsesAllowed: m.UsesAllowed, UsesHeld: m.UsesHeld,
		UsesSpent: m.UsesSpent, UsesInDoubt: m.UsesInDoubt, Currency: m.Currency, MaxAmount: m.MaxAmount,
		AmountHeld: m.AmountHeld, AmountSpent: m.AmountSpent, ReleaseCancel: m.ReleaseOnCancel,
		Operations: m.Operations, Targets: m.Targets, HoldSeconds: int64(m.HoldWindow / time.Second),
		ExecutionTimeout: int64(m.ExecutionTimeout / time.Second), Executions: m.Executions, LastAuthID: m.LastAuthID,
	}
	if !m.ValidFrom.IsZero() {
		vf := m.ValidFrom
		v.ValidFrom = &vf
	}
	if m.TotalLimit > 0 {
		tl := m.TotalLimit
		v.TotalLimit = &tl
	}
	if !m.ValidUntil.IsZero() {
		vu := m.ValidUntil
		v.ValidUntil = &vu
	}
	return v
}

// IntentScope is the scope of an intent: like an idempotency key, one
// mandate (org and mandate id) and one operation, then the workflow facts
// that name the action. The same intent on two mandates is two actions.
type IntentScope struct {
	Org       string
	MandateID string
	Operation string
	wire.Intent
}

// Mandate is the scope's mandate.
func (s IntentScope) Mandate() partitioner.MandateKey {
	return partitioner.MandateKey{Org: s.Org, MandateID: s.MandateID}
}

// RecordScopePrefix puts a recorded read's intent in a scope of its own:
// the operation of a record's intent scope is "record:" + the read's
// operation. The colon is outside the operation grammar, so no proposal's
// intent can ever be a read's (a read never replays, blocks or is replayed
// by an effect), and binds.intent.operation shows it, so recovery rebuilds
// the record's intent like any other.
const RecordScopePrefix = "record:"

// IntentScopeOf returns the intent scope of a propose that carries one, or
// of a record.
func IntentScopeOf(c *wire.Command) (IntentScope, bool) {
	switch {
	case c.Type == wire.CmdPropose && c.Propose != nil && c.Propose.Intent != nil:
		return IntentScope{Org: c.Key.Org, MandateID: c.Key.MandateID, Operation: c.Propose.Operation, Intent: *c.Propose.Intent}, true
	case c.Type == wire.CmdRecord && c.Record != nil:
		return IntentScope{Org: c.Key.Org, MandateID: c.Key.MandateID, Operation: RecordScopePrefix + c.Record.Operation, Intent: c.Record.Intent}, true
	}
	return IntentScope{}, false
}

// IntentRecord binds an intent to the first authorization it produced
// (Root) and follows its lineage: Head is that authorization or the latest
// fork that superseded it. Every member of the lineage but Head is terminal.
// Root and Head are authorizations of the scope's mandate (intents bound
// before migration 0016 may have a Head on another mandate of the org).
type IntentRecord struct {
	Scope      IntentScope
	Root       AuthKey
	DecisionID string // the decision that reserved Root
	Head       AuthKey
	Partition  int32 // Root's partition (whose background job purges the record)
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time // retention like a key's; never purged while Head is live

	LoadedHead AuthKey // Head as read from storage (zero when new)
	New        bool    // created in this batch
	Dirty      bool    // Head moved in this batch
}

// ReplayPolicy says what a possible replay (no intent, same material
// fingerprint within the org's window) is answered with.
type ReplayPolicy string

const (
	ReplayDeny ReplayPolicy = "deny" // denied possible_replay, naming the earlier authorization
	ReplayFlag ReplayPolicy = "flag" // decided normally; the decision names the earlier authorization
)

// Valid reports whether p is a known policy.
func (p ReplayPolicy) Valid() bool { return p == ReplayDeny || p == ReplayFlag }

// ReplaySetting is an org's possible-replay window and policy; a zero
// Window turns the check off.
type ReplaySetting struct {
	Window time.Duration
	Policy ReplayPolicy
}
