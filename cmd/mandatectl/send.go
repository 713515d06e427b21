package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// outcomeExit is the exit code a decision's outcome gives.
func outcomeExit(o wire.Outcome) int {
	switch o {
	case wire.OutcomeReserved, wire.OutcomeGranted, wire.OutcomeExecuting, wire.OutcomeCommitted,
		wire.OutcomeCancelled, wire.OutcomeRevoked, wire.OutcomeReplayed, wire.OutcomeRecorded:
		return exitOK
	case wire.OutcomeRejected:
		return exitUsage
	default: // denied, refused, conflict, stale_version, in_doubt, expired, and anything newer
		return exitFailed
	}
}

// sendCommand turns a command spec into a mandatectl command: build the
// JSON command from flags, validate it as the processor will, produce it
// keyed by its mandate, and wait for the decision that answers it.
func sendCommand(spec commandSpec, summary string) *command {
	topicNote := "proposals topic"
	if spec.typ.IsGrantorCommand() {
		topicNote = "grants topic"
	}
	description := spec.description + `

The command is validated as mandated will decode it (an invalid flag exits 2
and nothing is produced), produced to the ` + topicNote + ` keyed
"<org>/<mandate_id>" with Kafka's default (murmur2) partitioner, and then
mandatectl waits, up to --timeout, for the decision whose source is the
produced record, reading the decisions topic with read_committed. It prints
the decision (--json: the decision as published) and exits 0 for reserved,
granted, executing, committed, cancelled, revoked or replayed; 1 for denied,
refused, conflict, stale_version, in_doubt or expired; 2 for rejected; 3 when
no decision came within --timeout (the command was produced and will still be
decided).`
	return leafWith(&command{
		name:        strings.ReplaceAll(string(spec.typ), "_", "-"),
		group:       groupCommands,
		summary:     summary,
		usage:       spec.synopsis,
		description: description,
		examples:    spec.examples,
	}, func() *sendOptions { return &sendOptions{spec: spec} }, runSend)
}

// sendOptions are the flags of a command mandatectl produces.
type sendOptions struct {
	spec    commandSpec
	kc      kafkaConn
	topics  topicNames
	org     string
	mandate string
	idemKey string
	timeout time.Duration
	asJSON  bool
	noWait  bool
	build   func(set map[string]bool) (map[string]any, error) // the spec's own flags, as JSON fields
	signing signingFlags
	db      dbConn // a signed grant reads the mandate's version here

	set  map[string]bool
	key  partitioner.MandateKey
	body map[string]any
}

func (o *sendOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	f.StringVar(&o.org, "org", "", "the mandate's org (required unless --mandate is <org>/<mandate_id>)")
	f.StringVar(&o.mandate, "mandate", "", "the mandate id, or <org>/<mandate_id> (required)")
	keyHelp := "idempotency key of this intent (optional: makes a retry a replay)"
	if o.spec.needsKey {
		keyHelp = "idempotency key of this business intent, the same on every retry (required)"
	}
	f.StringVar(&o.idemKey, "key", "", keyHelp)
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for the decision")
	f.BoolVar(&o.asJSON, "json", false, "print the decision as published (JSON) instead of a table")
	f.BoolVar(&o.noWait, "no-wait", false, "produce the command and exit 0 without waiting for its decision")
	o.build = o.spec.flags(f.FlagSet)
	if o.spec.typ.Signable() {
		o.signing.register(f.FlagSet)
	}
	if o.spec.basedOn {
		o.db.register(f)
	}
}

// validate builds the command's JSON fields from the flags. What needs
// the database (a signed grant's version), the signing key or the
// processor's decoder is checked by run, in that order, as before.
func (o *sendOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	o.set = in.set
	var err error
	if o.key, err = mandateKeyFromFlags(o.org, o.mandate); err != nil {
		return err
	}
	if o.spec.needsKey && o.idemKey == "" {
		return errors.New("--key is required")
	}
	o.body, err = o.build(in.set)
	return err
}

func runSend(ctx context.Context, a *app, o *sendOptions) int {
	spec, name, key, body := o.spec, a.path, o.key, o.body
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	if spec.basedOn && o.signing.keyFile != "" && !o.set["based-on-version"] {
		v, note, err := currentVersion(ctx, &o.db, key)
		if err != nil {
			a.errorf("%s: %v", name, err)
			return exitFailed
		}
		body["based_on_version"] = v
		fmt.Fprintf(a.stderr, "mandatectl: %s: signed based on mandate version %d (%s)\n", name, v, note)
	}
	body["v"] = wire.SchemaVersion
	body["type"] = string(spec.typ)
	body["org"] = key.Org
	body["mandate_id"] = key.MandateID
	if o.idemKey != "" {
		body["idempotency_key"] = o.idemKey
	}
	body["sent_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	value, err := json.Marshal(body)
	if err != nil {
		a.errorf("%s: encode the command: %v", name, err)
		return exitFailed
	}
	if value, err = o.signing.sign(value); err != nil {
		return a.usageErr("%v", err)
	}
	// Decode exactly as the processor will: a command it would reject is
	// a usage error here, and nothing is produced.
	if _, rej := wire.Decode(key.Bytes(), value, wire.Limits{}); rej != nil {
		a.errorf("%s: the command is invalid (%s): %s", name, rej.Reason, rej.Detail)
		return exitUsage
	}
	opts, err := o.kc.opts()
	if err != nil {
		return a.usageErr("%v", err)
	}
	topic := o.topics.proposals
	if spec.typ.IsGrantorCommand() {
		topic = o.topics.grants
	}
	s := sender{opts: opts, topic: topic, decisions: o.topics.decisions}
	src, err := s.produce(ctx, key, value, a)
	if err != nil {
		if ctx.Err() != nil {
			a.errorf("%s: timed out after %s producing to %s; the command may or may not have been written: %v", name, o.timeout, topic, err)
			return exitTimeout
		}
		a.errorf("%s: %v", name, err)
		return exitFailed
	}
	if o.noWait {
		fmt.Fprintf(a.stdout, "produced %s for %s to %s/%d at offset %d\n", spec.typ, key, src.Topic, src.Partition, src.Offset)
		return exitOK
	}
	d, raw, err := s.await(ctx, src)
	if err != nil {
		if ctx.Err() != nil && a.ctx.Err() == nil {
			a.errorf("%s: no decision for %s/%d@%d within %s; the command was produced and will still be decided "+
				"(is mandated running? 'mandatectl partitions' shows owners and lag; 'mandatectl tail --mandate %s' shows it when it comes)",
				name, src.Topic, src.Partition, src.Offset, o.timeout, key)
			return exitTimeout
		}
		a.errorf("%s: waiting for the decision: %v", name, err)
		return exitFailed
	}
	if o.asJSON {
		fmt.Fprintf(a.stdout, "%s\n", raw)
	} else {
		printDecision(a.stdout, d)
	}
	return outcomeExit(d.Outcome)
}

// currentVersion returns the version a signed grant is based on when the
// operator named none: the mandate's current version read from PostgreSQL
// (0 when there is no such mandate), or 0 — the grant that creates the
// mandate, refused stale_grant if it exists — when no database is given.
// It also says where the version came from.
func currentVersion(ctx context.Context, db *dbConn, key partitioner.MandateKey) (int64, string, error) {
	if db.url == "" && db.urlFile == "" && db.shardMap == "" {
		return 0, "no database given: the grant that creates the mandate; to change an existing mandate's terms give --based-on-version or --database-url", nil
	}
	op, closeDB, err := db.operator(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("read the mandate's version: %w", err)
	}
	defer closeDB()
	snap, err := op.Inspect(ctx, key, 0)
	switch {
	case errors.Is(err, sink.ErrNotFound):
		return 0, "read from PostgreSQL: no such mandate yet", nil
	case err != nil:
		return 0, "", fmt.Errorf("read the mandate's version: %w", err)
	}
	return snap.Mandate.Version, fmt.Sprintf("read from PostgreSQL; its terms are of version %d", snap.Mandate.TermsVersion), nil
}

// mandateKeyFromFlags accepts --org ORG --mandate ID or --mandate ORG/ID.
func mandateKeyFromFlags(org, mandate string) (partitioner.MandateKey, error) {
	if mandate == "" {
		return partitioner.MandateKey{}, errors.New("--mandate is required")
	}
	if o, id, ok := strings.Cut(mandate, "/"); ok {
		if org != "" && org != o {
			return partitioner.MandateKey{}, fmt.Errorf("--org %q and --mandate %q name different orgs", org, mandate)
		}
		org, mandate = o, id
	}
	if org == "" {
		return partitioner.MandateKey{}, errors.New("--org is required (or give --mandate as <org>/<mandate_id>)")
	}
	return partitioner.NewMandateKey(org, mandate)
}

// sender produces one command and finds its decision.
type sender struct {
	opts      []kgo.Opt
	topic     string
	decisions string

	// start is the decisions partition's last stable offset just before
	// the command was produced: its decision lies at or after it.
	start int64
}

func (s *sender) produce(ctx context.Context, key partitioner.MandateKey, value []byte, a *app) (wire.Source, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, s.opts...), kgo.ProducerLinger(0))...)
	if err != nil {
		return wire.Source{}, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, s.topic, s.decisions)
	if err != nil {
		return wire.Source{}, fmt.Errorf("list topics: %w", err)
	}
	for _, t := range []string{s.topic, s.decisions} {
		if d, ok := td[t]; !ok || d.Err != nil || len(d.Partitions) == 0 {
			return wire.Source{}, fmt.Errorf("topic %q is not usable (create the topics with 'mandatectl topics create')", t)
		}
	}
	n := int32(len(td[s.topic].Partitions))
	if m := int32(len(td[s.decisions].Partitions)); m != n {
		return wire.Source{}, fmt.Errorf("topic %q has %d partitions but %q has %d", s.topic, n, s.decisions, m)
	}
	home := key.Partition(n)
	ends, err := adm.ListCommittedOffsets(ctx, s.decisions)
	if err != nil {
		return wire.Source{}, fmt.Errorf("list the end offsets of %s: %w", s.decisions, err)
	}
	if err := ends.Error(); err != nil {
		return wire.Source{}, fmt.Errorf("list the end offsets of %s: %w", s.decisions, err)
	}
	end, ok := ends.Lookup(s.decisions, home)
	if !ok {
		return wire.Source{}, fmt.Errorf("no end offset for %s/%d", s.decisions, home)
	}
	s.start = end.Offset

	r := &kgo.Record{Topic: s.topic, Key: key.Bytes(), Value: value}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return wire.Source{}, fmt.Errorf("produce to %s: %w", s.topic, err)
	}
	if r.Partition != home {
		// Franz-go's default partitioner is Kafka's murmur2; this can only
		// happen if the partition count changed between two metadata reads.
		fmt.Fprintf(a.stderr, "mandatectl: warning: the record landed on partition %d, not on %s's home %d; mandated will forward it\n",
			r.Partition, key, home)
	}
	return wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}, nil
}

// await reads the decisions partition from s.start (read_committed) until
// it finds the decision whose source is src.
func (s *sender) await(ctx context.Context, src wire.Source) (*wire.Decision, []byte, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, s.opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.decisions: {src.Partition: kgo.NewOffset().At(s.start)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
		})
		if ferr != nil {
			return nil, nil, ferr
		}
		var found *wire.Decision
		var raw []byte
		fetches.EachRecord(func(r *kgo.Record) {
			if found != nil {
				return
			}
			d, err := wire.ParseDecision(r.Value)
			if err == nil && d.Source != nil && *d.Source == src {
				found, raw = d, r.Value
			}
		})
		if found != nil {
			return found, raw, nil
		}
	}
}
