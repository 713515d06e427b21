package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
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

// commandRunner turns a command spec into a mandatectl command: build the
// JSON command from flags, validate it as the processor will, produce it
// keyed by its mandate, and wait for the decision that answers it.
func commandRunner(spec commandSpec) func(a *app, args []string) int {
	return func(a *app, args []string) int {
		name := strings.ReplaceAll(string(spec.typ), "_", "-")
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
		f := a.newFlagSet(name, spec.synopsis, description, spec.examples...)
		var kc kafkaConn
		kc.register(f)
		var topics topicNames
		topics.register(f)
		org := f.String("org", "", "the mandate's org (required unless --mandate is <org>/<mandate_id>)")
		mandate := f.String("mandate", "", "the mandate id, or <org>/<mandate_id> (required)")
		keyHelp := "idempotency key of this intent (optional: makes a retry a replay)"
		if spec.needsKey {
			keyHelp = "idempotency key of this business intent, the same on every retry (required)"
		}
		idemKey := f.String("key", "", keyHelp)
		timeout := f.Duration("timeout", 30*time.Second, "how long to wait for the decision")
		asJSON := f.Bool("json", false, "print the decision as published (JSON) instead of a table")
		noWait := f.Bool("no-wait", false, "produce the command and exit 0 without waiting for its decision")
		build := spec.flags(f.FlagSet)
		var signing signingFlags
		if spec.typ.Signable() {
			signing.register(f.FlagSet)
		}
		var db dbConn
		if spec.basedOn {
			db.register(f)
		}

		pos, code, ok := f.parse(args)
		if !ok {
			return code
		}
		if len(pos) > 0 {
			return f.usageErr("unexpected argument %q", pos[0])
		}
		set := map[string]bool{}
		f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		key, err := mandateKeyFromFlags(*org, *mandate)
		if err != nil {
			return f.usageErr("%v", err)
		}
		if spec.needsKey && *idemKey == "" {
			return f.usageErr("--key is required")
		}
		body, err := build(set)
		if err != nil {
			return f.usageErr("%v", err)
		}
		ctx, cancel := withTimeout(a.ctx, *timeout)
		defer cancel()
		if spec.basedOn && signing.keyFile != "" && !set["based-on-version"] {
			v, note, err := currentVersion(ctx, &db, key)
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
		if *idemKey != "" {
			body["idempotency_key"] = *idemKey
		}
		body["sent_at"] = time.Now().UTC().Format(time.RFC3339Nano)
		value, err := json.Marshal(body)
		if err != nil {
			a.errorf("%s: encode the command: %v", name, err)
			return exitFailed
		}
		if value, err = signing.sign(value); err != nil {
			return f.usageErr("%v", err)
		}
		// Decode exactly as the processor will: a command it would reject is
		// a usage error here, and nothing is produced.
		if _, rej := wire.Decode(key.Bytes(), value, wire.Limits{}); rej != nil {
			a.errorf("%s: the command is invalid (%s): %s", name, rej.Reason, rej.Detail)
			return exitUsage
		}
		opts, err := kc.opts(a)
		if err != nil {
			return f.usageErr("%v", err)
		}
		topic := topics.proposals
		if spec.typ.IsGrantorCommand() {
			topic = topics.grants
		}
		s := sender{opts: opts, topic: topic, decisions: topics.decisions}
		src, err := s.produce(ctx, key, value, a)
		if err != nil {
			if ctx.Err() != nil {
				a.errorf("%s: timed out after %s producing to %s; the command may or may not have been written: %v", name, *timeout, topic, err)
				return exitTimeout
			}
			a.errorf("%s: %v", name, err)
			return exitFailed
		}
		if *noWait {
			fmt.Fprintf(a.stdout, "produced %s for %s to %s/%d at offset %d\n", spec.typ, key, src.Topic, src.Partition, src.Offset)
			return exitOK
		}
		d, raw, err := s.await(ctx, src)
		if err != nil {
			if ctx.Err() != nil && a.ctx.Err() == nil {
				a.errorf("%s: no decision for %s/%d@%d within %s; the command was produced and will still be decided "+
					"(is mandated running? 'mandatectl partitions' shows owners and lag; 'mandatectl tail --mandate %s' shows it when it comes)",
					name, src.Topic, src.Partition, src.Offset, *timeout, key)
				return exitTimeout
			}
			a.errorf("%s: waiting for the decision: %v", name, err)
			return exitFailed
		}
		if *asJSON {
			fmt.Fprintf(a.stdout, "%s\n", raw)
		} else {
			printDecision(a.stdout, d)
		}
		return outcomeExit(d.Outcome)
	}
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
