package fault

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"
)

// Provider is the fake external provider (a payment service): a ledger of
// side effects in its own store, an append-only fsynced file. It does NOT
// deduplicate: every call that gets through is one more effect, so the
// ledger counts what callers really did (seed 001's "side effects per
// operation identity"). The one thing it remembers is reconciliation's
// answer: an operation settled as not executed is voided, and a late call
// for it is refused (the provider-side record of the reconciler's decision,
// as a fencing store would refuse an older execution).
type Provider struct {
	mu      sync.Mutex
	f       *os.File
	path    string
	state   map[string]*ledgerEntry // op id → entry
	rng     *rand.Rand
	faults  ProviderFaults
	Calls   int
	Lost    int
	Refused int
	// Duplicates counts calls for an operation that already had an effect:
	// each is a second effect in the ledger.
	Duplicates int
}

// ProviderFaults are the provider's injectable misbehaviours.
type ProviderFaults struct {
	FailBefore float64       // the call times out before anything happens
	LostReply  float64       // the effect happens, the reply is lost
	Delay      time.Duration // added to every call (upper bound, uniform)
}

type ledgerEntry struct {
	Op      string    `json:"op"`
	Kind    string    `json:"kind"` // "effect" or "void"
	Intent  string    `json:"intent,omitempty"`
	Mandate string    `json:"mandate,omitempty"`
	Amount  int64     `json:"amount,omitempty"`
	Ref     string    `json:"ref,omitempty"`
	At      time.Time `json:"at"`
}

// ErrUnknown is a call whose outcome the caller cannot know.
var ErrUnknown = errors.New("provider: timed out; outcome unknown")

// ErrVoided is a call for an operation that reconciliation voided.
var ErrVoided = errors.New("provider: operation voided")

// NewProvider opens a ledger file.
func NewProvider(path string, seed uint64, faults ProviderFaults) (*Provider, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &Provider{f: f, path: path, state: map[string]*ledgerEntry{}, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), faults: faults}, nil
}

// Close closes the ledger file.
func (p *Provider) Close() error { return p.f.Close() }

func (p *Provider) append(e *ledgerEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := p.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return p.f.Sync()
}

// Execute performs the side effect for op once.
func (p *Provider) Execute(op, intent, mandate string, amount int64) (string, error) {
	p.mu.Lock()
	p.Calls++
	delay := time.Duration(0)
	if p.faults.Delay > 0 {
		delay = time.Duration(p.rng.Int64N(int64(p.faults.Delay)))
	}
	failBefore := p.rng.Float64() < p.faults.FailBefore
	lost := p.rng.Float64() < p.faults.LostReply
	p.mu.Unlock()
	time.Sleep(delay) // the provider's own latency; not a test wait

	p.mu.Lock()
	defer p.mu.Unlock()
	prev := p.state[op]
	if prev != nil && prev.Kind == "void" {
		p.Refused++
		return "", ErrVoided
	}
	if failBefore {
		p.Lost++
		return "", ErrUnknown
	}
	e := &ledgerEntry{Op: op, Kind: "effect", Intent: intent, Mandate: mandate, Amount: amount,
		Ref: fmt.Sprintf("pay_%s", op), At: time.Now()}
	if prev != nil {
		p.Duplicates++
		e.Ref = fmt.Sprintf("pay_%s_%d", op, p.Duplicates) // a second refund has its own reference
	}
	if err := p.append(e); err != nil {
		return "", fmt.Errorf("provider ledger: %w", err)
	}
	if prev == nil {
		p.state[op] = e
	}
	if lost {
		p.Lost++
		return "", ErrUnknown
	}
	return e.Ref, nil
}

// Settle answers reconciliation for op definitively: executed with its
// reference, or not executed — in which case op is voided, so a call still
// in flight can never execute it later.
//
// Other processes (the resumers of S-12b) append their effects to the same
// ledger file, so what is not known in memory is looked up there.
func (p *Provider) Settle(op string) (executed bool, ref string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.state[op]; e != nil {
		return e.Kind == "effect", e.Ref, nil
	}
	effects, err := ReadLedger(p.path)
	if err != nil {
		return false, "", err
	}
	for _, e := range effects {
		if e.Op == op {
			p.state[op] = &ledgerEntry{Op: op, Kind: "effect", Ref: e.Ref}
			return true, e.Ref, nil
		}
	}
	e := &ledgerEntry{Op: op, Kind: "void", At: time.Now()}
	if err := p.append(e); err != nil {
		return false, "", err
	}
	p.state[op] = e
	return false, "", nil
}

// Effect is one side effect read back from the ledger file.
type Effect struct {
	Op, Intent, Mandate, Ref string
	Amount                   int64
}

// ReadLedger reads every effect from a ledger file, as an auditor would.
func ReadLedger(path string) ([]Effect, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Effect
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e ledgerEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("ledger line %q: %w", sc.Text(), err)
		}
		if e.Kind == "effect" {
			out = append(out, Effect{Op: e.Op, Intent: e.Intent, Mandate: e.Mandate, Ref: e.Ref, Amount: e.Amount})
		}
	}
	return out, sc.Err()
}
