package gateway_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/wire"
)

// What the Python and TypeScript suites need to test decision signatures
// against the real gateway (their wrappers, python_test.go and
// typescript_test.go, pass it on in the environment):
//
//	MANDATED_DECISION_KEYS         a file the real `mandatectl decision-keys
//	                               list --json` wrote: the deployment's keys,
//	                               as an operator hands them to a caller
//	MANDATED_UNCHECKED_GATEWAY_URL a second gateway whose client does not
//	                               check signatures (a gateway of an older
//	                               version, or one that cannot read the keys):
//	                               it answers with whatever reaches the topic
//	                               first, through the validating proxy
//	MANDATED_TEST_FORGER_URL       someone holding mandated's Kafka credential:
//	                               POST /hold stops the processor; POST /forge
//	                               {"count": n} waits for n commands on the
//	                               proposals topic since the hold, answers each
//	                               on the decisions topic first — continuing the
//	                               partition's chain, a begin with `executing`
//	                               (unsigned), a proposal with `reserved` (signed
//	                               by a key of the forger's own under the id of
//	                               the deployment's key) — and starts the
//	                               processor again, which then decides them itself
//
// The forged signature names the deployment's key: one naming a key the
// database does not know could be mandated's own, signed with a key
// registered after a backup, so the processor would take the partition for
// rewound (and wait for `mandatectl recover`) instead of deciding past it.
type signatureFixtures struct {
	keysFile  string
	unchecked *validatingProxy
	forger    string
}

func (f signatureFixtures) env() []string {
	return []string{"MANDATED_DECISION_KEYS=" + f.keysFile, "MANDATED_UNCHECKED_GATEWAY_URL=" + f.unchecked.url,
		"MANDATED_TEST_FORGER_URL=" + f.forger}
}

// mandatectl builds the real mandatectl (once per test process), so that
// the suites load what it prints; it can run before the harness exists.
func buildMandatectl(t *testing.T) func() string {
	t.Helper()
	var path string
	done := make(chan struct{})
	go func() { defer close(done); path = procs.Binary(t, "mandatectl") }()
	return func() string { <-done; return path }
}

func newSignatureFixtures(ctx context.Context, t *testing.T, b *testBundle, mandatectl func() string) signatureFixtures {
	t.Helper()
	out, err := exec.CommandContext(ctx, mandatectl(), "decision-keys", "list", "--json", "--database-url", b.h.DatabaseURL).Output()
	require.NoError(t, err, "mandatectl decision-keys list --json")
	require.Contains(t, string(out), b.h.Signer.KeyID(), "the harness's key is registered: %s", out)
	keys := filepath.Join(t.TempDir(), "decision-keys.json")
	require.NoError(t, os.WriteFile(keys, out, 0o644))

	unchecked := serveUnchecked(t, b)
	return signatureFixtures{keysFile: keys, unchecked: newValidatingProxy(t, unchecked, b.spec), forger: serveForger(t, b)}
}

// serveUnchecked runs a gateway whose client has no decision keys.
func serveUnchecked(t *testing.T, b *testBundle) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := b.h
	cl, err := client.New(ctx, client.Config{Brokers: h.Brokers, KafkaOpts: h.KafkaOpts,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions,
		FetchMaxWait: 50 * time.Millisecond})
	require.NoError(t, err)
	srv, err := gateway.New(gateway.Config{}, cl, b.pool, prometheus.NewRegistry())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := srv.HTTPServer(ln.Addr().String(), srv.Handler())
	go func() { _ = srv.Serve(hs, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		cl.Close()
	})
	return "http://" + ln.Addr().String()
}

// forger holds the processor and forges answers on the topic.
type forger struct {
	b       *testBundle
	pool    *pgxpool.Pool
	foreign *wire.RecordSigner // a key of the forger's own, no key of the deployment

	mu     sync.Mutex
	held   map[int32]int64 // proposals partition -> end offset at the hold
	starts int
}

func serveForger(t *testing.T, b *testBundle) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, b.h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "someone holding the kafka credential")
	f := &forger{b: b, pool: pool, foreign: wire.NewRecordSigner(ed25519.NewKeyFromSeed(seed))}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hold", func(w http.ResponseWriter, r *http.Request) {
		if err := f.hold(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("POST /forge", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Count int `json:"count"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Count < 1 {
			http.Error(w, "want {\"count\": n}", http.StatusBadRequest)
			return
		}
		forged, err := f.forge(r.Context(), in.Count)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"forged": forged})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

func (f *forger) hold(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held != nil {
		return fmt.Errorf("already held")
	}
	f.b.h.Stop(f.b.inst)
	ends, err := endOffsets(ctx, f.b.h, f.b.h.Spec.Proposals)
	if err != nil {
		return err
	}
	f.held = ends
	return nil
}

// forge answers the first n commands produced since the hold, in order,
// and starts the processor again; it answers once the processor is ready:
// mandated decides past the forgeries, on every partition.
func (f *forger) forge(ctx context.Context, n int) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == nil {
		return nil, fmt.Errorf("not held: POST /hold first")
	}
	forged, err := f.forgeHeld(ctx, n)
	f.held = nil
	f.starts++
	f.b.inst = f.b.h.Start(fmt.Sprintf("after-forgery-%d", f.starts))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := f.b.inst.Service.Processor.Ready(ctx)
		if err == nil {
			return forged, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the processor is not ready 60 s after the forgeries (it must decide past them): %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling readiness, bounded by the deadline
		}
	}
}

func (f *forger) forgeHeld(ctx context.Context, n int) ([]string, error) {
	h := f.b.h
	cmds, err := f.commandsSinceHold(ctx, n)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID(fmt.Sprintf("%s-forger-%d", h.TxnPrefix, f.starts))}, h.KafkaOpts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	heads := map[int32]*chainHead{}
	var forged []string
	for _, c := range cmds {
		head, ok := heads[c.Partition]
		if !ok {
			if head, err = f.head(ctx, c.Partition); err != nil {
				return nil, err
			}
			heads[c.Partition] = head
		}
		rec, id, err := f.answer(head, c)
		if err != nil {
			return nil, err
		}
		if err := cl.BeginTransaction(); err != nil {
			return nil, err
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return nil, err
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return nil, err
		}
		forged = append(forged, id)
	}
	return forged, nil
}

// commandsSinceHold reads the first n records appended to the proposals
// topic since the hold (waiting for them, bounded).
func (f *forger) commandsSinceHold(ctx context.Context, n int) ([]*kgo.Record, error) {
	h := f.b.h
	offsets := map[int32]kgo.Offset{}
	for p, end := range f.held {
		offsets[p] = kgo.NewOffset().At(end)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{h.Spec.Proposals: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100 * time.Millisecond)}, h.KafkaOpts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%d of %d commands reached the proposals topic since the hold", len(out), n)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out[:n], nil
}

// chainHead is where a partition's chain stands: the next record continues it.
type chainHead struct {
	template wire.Decision // a decision of the partition, for the members a forger copies
	seq      int64         // the last sequence
	hash     wire.ChainHash
	epoch    int64
}

// head reads a partition's chain head from PostgreSQL (the processor is
// stopped: nothing moves it) and waits until the decision there is on the
// topic, so the forged record continues it.
func (f *forger) head(ctx context.Context, p int32) (*chainHead, error) {
	var next, epoch int64
	var hash []byte
	if err := f.pool.QueryRow(ctx, `SELECT next_seq, epoch, head_hash FROM mandated_partitions WHERE partition = $1`, p).
		Scan(&next, &epoch, &hash); err != nil {
		return nil, err
	}
	var template *wire.Decision
	deadline := time.Now().Add(30 * time.Second)
	for template == nil {
		for _, r := range f.b.h.Decisions.Records() {
			if r.Partition == p && r.Decision != nil && r.Seq == next-1 {
				template = r.Decision
			}
		}
		if template != nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("decision %d-%d (the chain's head in PostgreSQL) never reached the topic", p, next-1)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling the collector, bounded by the deadline
		}
	}
	return &chainHead{template: *template, seq: next - 1, hash: wire.ChainHash(hash), epoch: epoch}, nil
}

// answer forges the answer to one command, continuing head (and moving it).
func (f *forger) answer(head *chainHead, rec *kgo.Record) (*kgo.Record, string, error) {
	var cmd map[string]any
	if err := json.Unmarshal(rec.Value, &cmd); err != nil {
		return nil, "", err
	}
	d := head.template
	d.Sequence, d.Epoch = head.seq+1, head.epoch
	d.DecisionID = wire.DecisionID(d.Partition, d.Sequence)
	d.MandateKey, d.Org, d.MandateID = string(rec.Key), fmt.Sprint(cmd["org"]), fmt.Sprint(cmd["mandate_id"])
	d.Source = &wire.Source{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset}
	d.Reason, d.Detail, d.ReplayOf, d.OriginalOutcome, d.ForkOf, d.PossibleReplay = "", "", "", "", "", ""
	d.Binds, d.HeldBy, d.Differs, d.SignedBy, d.HomePartition, d.SentAt, d.PrevHash, d.Hash = nil, nil, nil, "", nil, nil, "", ""
	d.DecidedAt = time.Now().UTC()
	d.Command = fmt.Sprint(cmd["type"])
	view := wire.AuthorizationView{State: wire.StateReserved, Version: 1, Operation: "payment.refund", Target: "customer-77",
		Amount: wire.Money{MinorUnits: 1500, Currency: "EUR"}, Deadline: d.DecidedAt.Add(time.Hour), CreatedAt: d.DecidedAt, UpdatedAt: d.DecidedAt}
	signed := false
	switch d.Command {
	case "begin": // the licence to call the provider, for the executor that asked
		view.ID = fmt.Sprint(cmd["authorization_id"])
		view.State, view.Executor, view.ExecutionToken = wire.StateExecuting, fmt.Sprint(cmd["executor"]), 1
		dl := d.DecidedAt.Add(time.Hour)
		view.ExecutionDeadline = &dl
		d.Outcome, d.ExecutionToken, d.Detail = wire.OutcomeExecuting, 1, "forged: go on, call the provider"
	case "propose":
		view.ID = "au_forged" + strings.Repeat("0", 15)
		view.IdempotencyKey = fmt.Sprint(cmd["idempotency_key"])
		d.Outcome, d.Detail, signed = wire.OutcomeReserved, "forged, signed by a key of the forger's own under the deployment key's id", true
	default:
		return nil, "", fmt.Errorf("the forger answers begins and proposals, not %s", d.Command)
	}
	d.AuthorizationID, d.IdempotencyKey = view.ID, view.IdempotencyKey
	d.Authorization = &view
	if head.template.MandateKey != d.MandateKey {
		d.Mandate = nil // another mandate's view: none rather than a wrong one
	}
	enc, err := d.Encode()
	if err != nil {
		return nil, "", err
	}
	sealed, hash := wire.Seal(enc, head.hash)
	head.seq, head.hash = d.Sequence, hash
	out := &kgo.Record{Topic: f.b.h.Spec.Decisions, Partition: d.Partition, Key: []byte(d.MandateKey), Value: sealed,
		Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(fmt.Sprint(d.Sequence))},
			{Key: wire.HeaderEpoch, Value: []byte(fmt.Sprint(d.Epoch))}}}
	if signed {
		sig := strings.Fields(string(f.foreign.SignRecord(hash)))[2]
		out.Headers = append(out.Headers, kgo.RecordHeader{Key: wire.HeaderSignature,
			Value: []byte("ed25519 " + f.b.h.Signer.KeyID() + " " + sig)})
	}
	return out, d.DecisionID + " " + string(d.Outcome), nil
}

func endOffsets(ctx context.Context, h *harness.Harness, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}

// The Mandated-Signature response header is documented where the gateway
// sends it (a command's 200, a begin's, a problem carrying a decision), so
// the OpenAPI validation of every exchange (the Python and TypeScript
// suites' proxies) checks its form.
func TestTheSignatureHeaderIsDocumentedWhereItIsSent(t *testing.T) {
	t.Parallel()
	spec := openAPIValidator(t)
	example, err := os.ReadFile(filepath.Join("..", "wire", "testdata", "examples", "decision.json"))
	require.NoError(t, err)
	var decision bytes.Buffer
	require.NoError(t, json.Compact(&decision, example))
	seed := make([]byte, ed25519.SeedSize)
	good := string(wire.NewRecordSigner(ed25519.NewKeyFromSeed(seed)).SignRecord(wire.ChainHash{}))
	problem := append([]byte(`{"type":"urn:mandated:reason:already_executing","title":"Conflict","status":409,"reason":"already_executing","decision":`),
		append(decision.Bytes(), '}')...)
	for _, c := range []struct {
		path   string
		status int
		body   []byte
	}{
		{"/v1/orgs/acme/mandates/m-1/proposals", 200, decision.Bytes()},
		{"/v1/orgs/acme/mandates/m-1/authorizations/au_1/begin", 200, decision.Bytes()},
		{"/v1/orgs/acme/mandates/m-1/authorizations/au_1/begin", 409, problem},
	} {
		for sig, ok := range map[string]bool{good: true, "ed25519 " + strings.Repeat("A", 16) + " c2ln": false} {
			req, err := http.NewRequest("POST", "http://localhost:8090"+c.path, strings.NewReader(`{"operation":"payment.refund","amount":{"minor_units":1500,"currency":"EUR"},"target":"customer-77"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer t")
			req.Header.Set("Idempotency-Key", "k-1")
			ct := "application/json"
			if c.status >= 400 {
				ct = "application/problem+json"
			}
			resp := &http.Response{StatusCode: c.status, Header: http.Header{"Content-Type": {ct}, gateway.HeaderSignature: {sig}},
				Body: io.NopCloser(bytes.NewReader(c.body)), Request: req}
			valid, errs := spec.ValidateHttpResponse(req, resp)
			var msgs []string
			for _, e := range errs {
				msgs = append(msgs, e.Message+": "+e.Reason)
			}
			require.Equal(t, ok, valid, "%s %d %q: %v", c.path, c.status, sig, msgs)
		}
	}
}
