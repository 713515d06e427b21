package fault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/wire"
)

// WorkloadConfig shapes the traffic.
type WorkloadConfig struct {
	Seed            uint64
	Orgs            int           // default 3
	Mandates        int           // per org, default 8
	Agents          int           // default 6
	Every           time.Duration // pause between an agent's proposals, default 40ms
	AgentTimeout    time.Duration // an agent resends the same intent after this, default 4s
	AgentRetries    int           // default 3
	DupProb         float64       // send an intent twice at once, default 0.05
	ReuseChanged    float64       // reuse an earlier key with another amount, default 0.02
	CancelProb      float64       // the platform cancels a reservation, default 0.05
	AbandonProb     float64       // the platform lets a reservation expire, default 0.05
	HoldSeconds     int           // reservation window, default 4
	ExecTimeoutSecs int           // execution timeout, default 6
	NoAgents        bool          // a scenario drives its own traffic
}

func (c WorkloadConfig) withDefaults() WorkloadConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Orgs, 3)
	def(&c.Mandates, 8)
	def(&c.Agents, 6)
	def(&c.AgentRetries, 3)
	def(&c.HoldSeconds, 4)
	def(&c.ExecTimeoutSecs, 6)
	if c.Every == 0 {
		c.Every = 40 * time.Millisecond
	}
	if c.AgentTimeout == 0 {
		c.AgentTimeout = 4 * time.Second
	}
	if c.DupProb == 0 {
		c.DupProb = 0.05
	}
	if c.ReuseChanged == 0 {
		c.ReuseChanged = 0.02
	}
	if c.CancelProb == 0 {
		c.CancelProb = 0.05
	}
	if c.AbandonProb == 0 {
		c.AbandonProb = 0.05
	}
	return c
}

// MandateSpec is a granted mandate of the workload.
type MandateSpec struct {
	Org, ID    string
	Uses       int64
	MaxAmount  int64
	TotalLimit int64 // 0: none
}

// Key is "<org>/<id>".
func (m MandateSpec) Key() string { return m.Org + "/" + m.ID }

// Answer is what one caller saw for one send.
type Answer struct {
	Key      string // idempotency key
	Mandate  string
	Amount   int64
	Outcome  wire.Outcome
	AuthID   string
	Replay   string
	TimedOut bool
}

// Workload is the traffic: agents propose, a platform executes what is
// reserved through the provider, a reconciler resolves what is in doubt.
type Workload struct {
	cfg      WorkloadConfig
	brokers  []string
	spec     processor.TopicSpec
	provider *Provider
	producer *kgo.Client
	consumer *kgo.Client
	rng      *rand.Rand
	rngMu    sync.Mutex

	Mandates []MandateSpec

	mu       sync.Mutex
	waiters  map[wire.Source]chan wire.Decision
	early    map[wire.Source]wire.Decision // proposals answered before their sender waited
	answers  []Answer
	executed map[string]bool          // auth ids the platform has sent to the provider
	inDoubt  map[string]inDoubt       // auth id → when it went in doubt
	resolved map[string]bool          // auth ids resolved
	keysUsed map[string][]keyUse      // mandate key → keys used
	settled  map[string]wire.Decision // auth id → a decision showing it terminal or in doubt
	settle   chan struct{}            // closed and replaced when settled grows
	counts   map[string]int
	inflight sync.WaitGroup

	sent     atomic.Int64
	stop     chan struct{}
	agentsWG sync.WaitGroup
	bgWG     sync.WaitGroup
	cancel   context.CancelFunc
}

type keyUse struct {
	key    string
	amount int64
}

type inDoubt struct {
	org, mandate string
	token        int64 // the in-doubt execution's token
	since        time.Time
	lastResolve  time.Time
}

// NewWorkload connects; Grant and Start begin the traffic.
func NewWorkload(brokers []string, spec processor.TopicSpec, provider *Provider, cfg WorkloadConfig) (*Workload, error) {
	cfg = cfg.withDefaults()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0),
		kgo.RecordRetries(20), kgo.RequestRetries(20))
	if err != nil {
		return nil, err
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(spec.Decisions),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		prod.Close()
		return nil, err
	}
	w := &Workload{cfg: cfg, brokers: brokers, spec: spec, provider: provider, producer: prod, consumer: cons,
		rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed+1)), waiters: map[wire.Source]chan wire.Decision{},
		early:    map[wire.Source]wire.Decision{},
		executed: map[string]bool{}, inDoubt: map[string]inDoubt{}, resolved: map[string]bool{},
		keysUsed: map[string][]keyUse{}, counts: map[string]int{}, stop: make(chan struct{}),
		settled: map[string]wire.Decision{}, settle: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.bgWG.Add(2)
	go func() { defer w.bgWG.Done(); w.follow(ctx) }()
	go func() { defer w.bgWG.Done(); w.reconcile(ctx) }()
	return w, nil
}

func (w *Workload) float() float64 {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.Float64()
}

func (w *Workload) intn(n int) int {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return w.rng.IntN(n)
}

func (w *Workload) count(what string) {
	w.mu.Lock()
	w.counts[what]++
	w.mu.Unlock()
}

// Counts returns the workload's operation counts.
func (w *Workload) Counts() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.counts {
		out[k] = v
	}
	return out
}

// send produces one command; Kafka's producer retries transient errors.
func (w *Workload) send(ctx context.Context, cmd map[string]any) (wire.Source, error) {
	cmd["v"] = wire.SchemaVersion
	b, err := json.Marshal(cmd)
	if err != nil {
		return wire.Source{}, err
	}
	topic := w.spec.Proposals
	if t, _ := cmd["type"].(string); wire.CommandType(t).IsGrantorCommand() { // grant, revoke, resolve
		topic = w.spec.Grants
	}
	r := &kgo.Record{Topic: topic, Key: []byte(cmd["org"].(string) + "/" + cmd["mandate_id"].(string)), Value: b}
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = w.producer.ProduceSync(pctx, r).FirstErr()
		cancel()
		if err == nil {
			w.sent.Add(1)
			w.count("sent_" + cmd["type"].(string))
			return wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}, nil
		}
		if ctx.Err() != nil || attempt > 20 {
			return wire.Source{}, err
		}
		select {
		case <-ctx.Done():
			return wire.Source{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// Send produces one command (a map) and returns where it landed.
func (w *Workload) Send(ctx context.Context, cmd map[string]any) (wire.Source, error) {
	return w.send(ctx, cmd)
}

// SendWait produces one command and waits up to timeout for its answer.
func (w *Workload) SendWait(ctx context.Context, cmd map[string]any, timeout time.Duration) (wire.Decision, bool, error) {
	return w.sendWait(ctx, cmd, timeout)
}

// SendRaw produces raw bytes to a topic, keyed, and waits for the answer.
func (w *Workload) SendRaw(ctx context.Context, topic string, key, value []byte, timeout time.Duration) (wire.Decision, bool, error) {
	r := &kgo.Record{Topic: topic, Key: key, Value: value}
	if err := w.producer.ProduceSync(ctx, r).FirstErr(); err != nil {
		return wire.Decision{}, false, err
	}
	w.sent.Add(1)
	return w.Await(ctx, wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}, timeout)
}

// Await waits for the decision answering src.
func (w *Workload) Await(ctx context.Context, src wire.Source, timeout time.Duration) (wire.Decision, bool, error) {
	ch := make(chan wire.Decision, 1)
	w.mu.Lock()
	if d, ok := w.early[src]; ok {
		delete(w.early, src)
		w.mu.Unlock()
		return d, true, nil
	}
	w.waiters[src] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.waiters, src)
		w.mu.Unlock()
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case d := <-ch:
		return d, true, nil
	case <-t.C:
		return wire.Decision{}, false, nil
	case <-ctx.Done():
		return wire.Decision{}, false, ctx.Err()
	}
}

// sendWait sends and waits up to timeout for the answer.
func (w *Workload) sendWait(ctx context.Context, cmd map[string]any, timeout time.Duration) (wire.Decision, bool, error) {
	src, err := w.send(ctx, cmd)
	if err != nil {
		return wire.Decision{}, false, err
	}
	return w.Await(ctx, src, timeout)
}

// Grant grants the workload's mandates and waits for every answer.
func (w *Workload) Grant(ctx context.Context) error {
	for o := range w.cfg.Orgs {
		for i := range w.cfg.Mandates {
			m := MandateSpec{Org: fmt.Sprintf("org%d", o), ID: fmt.Sprintf("m%d", i), Uses: 1, MaxAmount: 2000}
			if i%2 == 1 {
				m.Uses, m.TotalLimit = 6, 6000
			}
			w.Mandates = append(w.Mandates, m)
		}
	}
	for _, m := range w.Mandates {
		cmd := map[string]any{"type": "grant", "org": m.Org, "mandate_id": m.ID, "uses": m.Uses,
			"idempotency_key": "grant-" + m.ID,
			"max_amount":      map[string]any{"minor_units": m.MaxAmount, "currency": "EUR"}, "operations": []string{"refund"},
			"hold_seconds": w.cfg.HoldSeconds, "execution_timeout_seconds": w.cfg.ExecTimeoutSecs}
		if m.TotalLimit > 0 {
			cmd["total_limit"] = map[string]any{"minor_units": m.TotalLimit, "currency": "EUR"}
		}
		for {
			d, ok, err := w.sendWait(ctx, cmd, 30*time.Second)
			if err != nil {
				return err
			}
			if ok && (d.Outcome == wire.OutcomeGranted || d.Outcome == wire.OutcomeReplayed) {
				break
			}
			if ok {
				return fmt.Errorf("grant %s: %s %s", m.Key(), d.Outcome, d.Reason)
			}
		}
	}
	return nil
}

// Start starts the agents.
func (w *Workload) Start(ctx context.Context) {
	if w.cfg.NoAgents {
		return
	}
	for a := range w.cfg.Agents {
		w.agentsWG.Add(1)
		go func() { defer w.agentsWG.Done(); w.agent(ctx, a) }()
	}
}

// StopAgents stops proposing and waits for the agents to finish their
// current intent.
func (w *Workload) StopAgents() {
	close(w.stop)
	w.agentsWG.Wait()
}

func (w *Workload) agent(ctx context.Context, id int) {
	for n := 0; ; n++ {
		select {
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(w.cfg.Every):
		}
		m := w.Mandates[w.intn(len(w.Mandates))]
		key := fmt.Sprintf("a%d-%d", id, n)
		amount := int64(100 + w.intn(int(m.MaxAmount)-100))
		if w.float() < w.cfg.ReuseChanged {
			w.mu.Lock()
			used := w.keysUsed[m.Key()]
			w.mu.Unlock()
			if len(used) > 0 {
				u := used[w.intn(len(used))]
				key, amount = u.key, u.amount+1 // the same key, another intent
				w.count("reused_key_changed")
			}
		}
		w.mu.Lock()
		w.keysUsed[m.Key()] = append(w.keysUsed[m.Key()], keyUse{key, amount})
		w.mu.Unlock()
		cmd := func() map[string]any {
			return map[string]any{"type": "propose", "org": m.Org, "mandate_id": m.ID, "idempotency_key": key,
				"operation": "refund", "target": "customer-1", "amount": map[string]any{"minor_units": amount, "currency": "EUR"}}
		}
		if w.float() < w.cfg.DupProb {
			w.count("duplicate_send")
			go func() { _, _ = w.send(ctx, cmd()) }()
		}
		for attempt := 0; attempt <= w.cfg.AgentRetries; attempt++ {
			d, ok, err := w.sendWait(ctx, cmd(), w.cfg.AgentTimeout)
			if err != nil {
				return
			}
			a := Answer{Key: key, Mandate: m.Key(), Amount: amount, TimedOut: !ok}
			if ok {
				a.Outcome, a.AuthID, a.Replay = d.Outcome, d.AuthorizationID, d.ReplayOf
			} else {
				w.count("agent_timeout")
			}
			w.mu.Lock()
			w.answers = append(w.answers, a)
			w.mu.Unlock()
			if ok {
				break
			}
		}
	}
}

// follow reads every decision: it answers waiting agents and drives the
// platform and the reconciler.
func (w *Workload) follow(ctx context.Context) {
	for {
		fetches := w.consumer.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fetches.EachRecord(func(r *kgo.Record) {
			d, err := wire.ParseDecision(r.Value)
			if err != nil {
				return
			}
			if d.Source != nil {
				w.mu.Lock()
				ch := w.waiters[*d.Source]
				if ch == nil {
					w.early[*d.Source] = *d
				}
				w.mu.Unlock()
				if ch != nil {
					select {
					case ch <- *d:
					default:
					}
				}
			}
			w.noteSettled(d)
			w.platform(ctx, d)
			w.noteDoubt(d)
		})
	}
}

// noteSettled remembers the latest decision showing an authorization
// terminal or in doubt, for callers waiting on another's outcome.
func (w *Workload) noteSettled(d *wire.Decision) {
	a := d.Authorization
	if a == nil || !(a.State.Terminal() || a.State == wire.StateInDoubt) {
		return
	}
	w.mu.Lock()
	if prev, ok := w.settled[a.ID]; !ok || prev.Authorization.Version <= a.Version {
		w.settled[a.ID] = *d
	}
	close(w.settle)
	w.settle = make(chan struct{})
	w.mu.Unlock()
}

// WaitSettled waits up to timeout for a decision showing the authorization
// terminal or in doubt: what a loser of a begin polls for instead of
// executing. false when none came in time.
func (w *Workload) WaitSettled(ctx context.Context, authID string, timeout time.Duration) (wire.Decision, bool) {
	return w.WaitSettledAs(ctx, authID, timeout, func(wire.Decision) bool { return true })
}

// WaitSettledAs waits up to timeout until the latest such decision about
// the authorization satisfies pred.
func (w *Workload) WaitSettledAs(ctx context.Context, authID string, timeout time.Duration, pred func(wire.Decision) bool) (wire.Decision, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		w.mu.Lock()
		d, ok := w.settled[authID]
		ch := w.settle
		w.mu.Unlock()
		if ok && pred(d) {
			return d, true
		}
		select {
		case <-ch:
		case <-t.C:
			return wire.Decision{}, false
		case <-ctx.Done():
			return wire.Decision{}, false
		}
	}
}

// platform reacts like an integrating platform: on a reservation it begins
// (or cancels, or forgets), on an execution grant it calls the provider
// and commits, or reports the outcome unknown.
func (w *Workload) platform(ctx context.Context, d *wire.Decision) {
	if d.Authorization == nil || !(strings.HasPrefix(d.Org, "org") || d.Org == "canary") {
		return // scenario orgs drive their own platform
	}
	auth := d.AuthorizationID
	switch {
	case d.Command == string(wire.CmdPropose) && d.Outcome == wire.OutcomeReserved:
		p := w.float()
		switch {
		case p < w.cfg.AbandonProb:
			w.count("platform_abandon")
		case p < w.cfg.AbandonProb+w.cfg.CancelProb:
			w.async(ctx, map[string]any{"type": "cancel", "org": d.Org, "mandate_id": d.MandateID, "authorization_id": auth, "reason": "customer withdrew"})
			w.count("platform_cancel")
		default:
			w.async(ctx, map[string]any{"type": "begin", "org": d.Org, "mandate_id": d.MandateID, "authorization_id": auth,
				"executor": "plat-" + auth})
		}
	case d.Command == string(wire.CmdBegin) && d.Authorization.State == wire.StateExecuting &&
		d.Authorization.Executor == "plat-"+auth && (d.Outcome == wire.OutcomeExecuting ||
		d.Outcome == wire.OutcomeReplayed && d.OriginalOutcome == wire.OutcomeExecuting):
		w.mu.Lock()
		already := w.executed[auth]
		w.executed[auth] = true
		w.mu.Unlock()
		if already {
			return
		}
		a := d.Authorization
		token := d.ExecutionToken
		w.inflight.Add(1)
		go func() {
			defer w.inflight.Done()
			intent := d.Org + "/" + a.Operation + "/" + a.IdempotencyKey
			ref, err := w.provider.Execute(auth, intent, d.MandateKey, a.Amount.MinorUnits)
			switch {
			case err == nil:
				w.count("provider_ok")
				_, _ = w.send(ctx, map[string]any{"type": "commit", "org": d.Org, "mandate_id": d.MandateID, "authorization_id": auth,
					"external_ref": ref, "execution_token": token, "result": map[string]any{"ref": ref}})
			case errors.Is(err, ErrUnknown):
				w.count("provider_unknown")
				_, _ = w.send(ctx, map[string]any{"type": "report_unknown", "org": d.Org, "mandate_id": d.MandateID, "authorization_id": auth,
					"detail": err.Error(), "execution_token": token})
			default:
				w.count("provider_refused")
			}
		}()
	}
}

func (w *Workload) async(ctx context.Context, cmd map[string]any) {
	w.inflight.Add(1)
	go func() { defer w.inflight.Done(); _, _ = w.send(ctx, cmd) }()
}

func (w *Workload) noteDoubt(d *wire.Decision) {
	if d.AuthorizationID == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case d.Outcome == wire.OutcomeInDoubt:
		if _, ok := w.inDoubt[d.AuthorizationID]; !ok && !w.resolved[d.AuthorizationID] {
			w.inDoubt[d.AuthorizationID] = inDoubt{org: d.Org, mandate: d.MandateID, since: time.Now(), token: d.ExecutionToken}
		}
	case d.Command == string(wire.CmdResolve) && (d.Outcome == wire.OutcomeCommitted || d.Outcome == wire.OutcomeCancelled ||
		d.Outcome == wire.OutcomeReplayed || d.Outcome == wire.OutcomeRefused):
		w.resolved[d.AuthorizationID] = true
		delete(w.inDoubt, d.AuthorizationID)
	}
}

// reconcile settles in-doubt authorizations with the provider: executed →
// resolve committed with its reference; not executed → the provider voids
// the operation and the authorization is resolved cancelled.
func (w *Workload) reconcile(ctx context.Context) {
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		var due []string
		for id, d := range w.inDoubt {
			if time.Since(d.lastResolve) > 5*time.Second {
				due = append(due, id)
			}
		}
		w.mu.Unlock()
		for _, id := range due {
			executed, ref, err := w.provider.Settle(id)
			if err != nil {
				continue
			}
			w.mu.Lock()
			d := w.inDoubt[id]
			d.lastResolve = time.Now()
			w.inDoubt[id] = d
			w.mu.Unlock()
			cmd := map[string]any{"type": "resolve", "org": d.org, "mandate_id": d.mandate, "authorization_id": id}
			if d.token != 0 {
				cmd["execution_token"] = d.token // the execution the provider was asked about
			}
			if executed {
				cmd["outcome"], cmd["external_ref"] = "committed", ref
			} else {
				cmd["outcome"], cmd["evidence"] = "cancelled", "provider voided the operation"
			}
			w.count("reconcile_" + cmd["outcome"].(string))
			_, _ = w.send(ctx, cmd)
		}
	}
}

// PendingDoubt returns how many in-doubt authorizations await resolution.
func (w *Workload) PendingDoubt() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.inDoubt)
}

// PendingDoubtIDs returns up to n of the in-doubt authorizations awaiting
// resolution, so that a drain that times out can say which.
func (w *Workload) PendingDoubtIDs(n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ids []string
	for id := range w.inDoubt {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids[:min(n, len(ids))]
}

// Answers returns what callers saw.
func (w *Workload) Answers() []Answer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Answer(nil), w.answers...)
}

// WaitPlatform waits for the platform's in-flight provider calls and sends.
func (w *Workload) WaitPlatform() { w.inflight.Wait() }

// Close stops everything.
func (w *Workload) Close() {
	w.cancel()
	w.bgWG.Wait()
	w.inflight.Wait()
	w.producer.Close()
	w.consumer.Close()
}
