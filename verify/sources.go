package verify

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// Recovery believes a record past PostgreSQL's head only if it answers
// what it says it answers. A record continuing the chain proves only that
// its writer knew the head: anyone holding mandated's Kafka credential
// can write one, and recovery would write its mandate view, its keys and
// its input position to PostgreSQL. So, before anything is written, each
// such record's input is checked against the input topic itself:
//
//   - its source offset is below the input partition's last stable offset
//     and at or above its log start (a record that is not there answers
//     nothing; 2^62 would make every later input "already decided");
//   - the source record read back is what the decision says it answers:
//     the same mandate, command, proposal key and authorization (a dead
//     letter: the same key and bytes); a decision that grants anything
//     answers a record that decodes;
//   - a grantor command's signature is verified again against the grantor
//     keys PostgreSQL holds, at the time the decision was made: a decision
//     that names a signer answers a record signed by that key, and one that
//     accepts an unsigned grantor command was made for an org that did not
//     require signing.
//
// The first record refused ends what is recovered: every later one
// continues the chain from it.

// sourceCheckLimits decodes input records at any size a processor may be
// configured to take: the size limit is the processor's, not recovery's.
var sourceCheckLimits = wire.Limits{MaxRecordBytes: 1 << 30}

// sourceChecker checks the ahead records of one partition.
type sourceChecker struct {
	cfg  *RecoverConfig
	p    int32
	ring *sink.Keyring
	// per input topic: the last stable and log start offsets of partition
	// p, and the records read back at the offsets the decisions name.
	lso, start map[string]int64
	records    map[wire.Source]*kgo.Record
}

// checkSources returns how many of records (in chain order) answer what
// they say, each decision among them parsed (nil for a dead letter), and
// why the next one is refused ("" when all do).
func checkSources(ctx context.Context, cfg *RecoverConfig, keys *pgxpool.Pool, p int32, records []outbox.Entry) (int, []*wire.Decision, string, error) {
	if len(records) == 0 {
		return 0, nil, "", nil
	}
	c := &sourceChecker{cfg: cfg, p: p, lso: map[string]int64{}, start: map[string]int64{}, records: map[wire.Source]*kgo.Record{}}
	decs := make([]*wire.Decision, len(records))
	want := map[string][]int64{}
	for i := range records {
		e := &records[i]
		src := e.Source
		if !e.DeadLetter {
			d, err := wire.ParseDecision(e.Value)
			if err != nil {
				return i, decs, fmt.Sprintf("sequence %d (%s offset %d): %v", e.Seq, e.Topic, e.Offset, err), nil
			}
			decs[i], src = d, d.Source
		}
		if src != nil && src.Partition == p && (src.Topic == cfg.ProposalsTopic || src.Topic == cfg.GrantsTopic) {
			want[src.Topic] = append(want[src.Topic], src.Offset)
		}
	}
	if err := c.readSources(ctx, want); err != nil {
		return 0, nil, "", err
	}
	var err error
	if c.ring, err = loadKeyring(ctx, keys); err != nil {
		return 0, nil, "", err
	}
	for i := range records {
		if why := c.check(&records[i], decs[i]); why != "" {
			e := &records[i]
			return i, decs, fmt.Sprintf("sequence %d (%s offset %d): %s", e.Seq, e.Topic, e.Offset, why), nil
		}
	}
	return len(records), decs, "", nil
}

// loadKeyring reads every grantor key and org signing mode (from the
// control shard with a shard map).
func loadKeyring(ctx context.Context, pool *pgxpool.Pool) (*sink.Keyring, error) {
	ring := &sink.Keyring{Keys: map[string]map[string]sink.GrantorKey{}}
	keys, err := sink.GrantorKeys(ctx, pool, "")
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if ring.Keys[k.Org] == nil {
			ring.Keys[k.Org] = map[string]sink.GrantorKey{}
		}
		ring.Keys[k.Org][k.KeyID] = k
	}
	if ring.Modes, err = sink.SigningModes(ctx, pool); err != nil {
		return nil, err
	}
	return ring, nil
}

// readSources reads the input partitions' offsets and the records at the
// offsets wanted that exist (below the last stable offset, at or above the
// log start): one scan per input topic, from the lowest to the highest.
func (c *sourceChecker) readSources(ctx context.Context, want map[string][]int64) error {
	cl, err := kgo.NewClient(c.cfg.KafkaOpts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, topic := range []string{c.cfg.ProposalsTopic, c.cfg.GrantsTopic} {
		ends, err := adm.ListCommittedOffsets(ctx, topic)
		if err != nil {
			return fmt.Errorf("list the last stable offsets of %s: %w", topic, err)
		}
		end, ok := ends.Lookup(topic, c.p)
		if !ok || end.Err != nil {
			return fmt.Errorf("no last stable offset for %s/%d: %v", topic, c.p, end.Err)
		}
		starts, err := adm.ListStartOffsets(ctx, topic)
		if err != nil {
			return fmt.Errorf("list the start offsets of %s: %w", topic, err)
		}
		start, _ := starts.Lookup(topic, c.p)
		c.lso[topic], c.start[topic] = end.Offset, max(start.Offset, 0)
		var offs []int64
		for _, o := range want[topic] {
			if o >= c.start[topic] && o < c.lso[topic] {
				offs = append(offs, o)
			}
		}
		if len(offs) == 0 {
			continue
		}
		slices.Sort(offs)
		offs = slices.Compact(offs)
		err = outbox.ScanRange(ctx, c.cfg.KafkaOpts, topic, c.p, offs[0], offs[len(offs)-1]+1, func(r *kgo.Record) error {
			if _, found := slices.BinarySearch(offs, r.Offset); found {
				c.records[wire.Source{Topic: topic, Partition: c.p, Offset: r.Offset}] = r
			}
			return nil
		}, nil)
		if err != nil {
			return fmt.Errorf("read back the input records of %s/%d: %w", topic, c.p, err)
		}
	}
	return nil
}

// check says why one record past the head is refused, or "".
func (c *sourceChecker) check(e *outbox.Entry, d *wire.Decision) string {
	src := e.Source
	if d != nil {
		src = d.Source
	}
	if src == nil {
		return "" // a deadline or a consequence: no input of its own (the rebuild checks its counters)
	}
	lso, ok := c.lso[src.Topic]
	switch {
	case !ok || src.Partition != c.p:
		return fmt.Sprintf("it answers %s/%d, not an input partition of partition %d", src.Topic, src.Partition, c.p)
	case src.Offset >= lso:
		return fmt.Sprintf("it answers %s/%d offset %d, at or past the last stable offset %d of that partition: no such record was ever committed",
			src.Topic, src.Partition, src.Offset, lso)
	case src.Offset < c.start[src.Topic]:
		return fmt.Sprintf("it answers %s/%d offset %d, below the partition's log start %d: the record is gone (retention), so what it answers cannot be checked",
			src.Topic, src.Partition, src.Offset, c.start[src.Topic])
	}
	r := c.records[*src]
	if r == nil {
		return fmt.Sprintf("it answers %s/%d offset %d, where no committed record is (an aborted transaction's or a control record's offset)",
			src.Topic, src.Partition, src.Offset)
	}
	if d == nil { // a dead letter carries the record it stands for
		if !bytes.Equal(r.Key, e.Key) || !bytes.Equal(r.Value, e.Value) {
			return fmt.Sprintf("the dead letter is not the record %s/%d offset %d it stands for (another key or value)", src.Topic, src.Partition, src.Offset)
		}
		return ""
	}
	cmd, rej := wire.Decode(r.Key, r.Value, sourceCheckLimits)
	if rej != nil {
		if d.Outcome != wire.OutcomeRejected {
			return fmt.Sprintf("it answers %s/%d offset %d with outcome %s, but that record is not a valid command (%v): only a rejection answers it",
				src.Topic, src.Partition, src.Offset, d.Outcome, rej)
		}
		return ""
	}
	says := func(what, decision, record string) string {
		return fmt.Sprintf("its %s %q is not what the record it answers says (%s/%d offset %d: %q)", what, decision, src.Topic, src.Partition, src.Offset, record)
	}
	switch {
	case d.MandateKey != cmd.Key.String():
		return says("mandate", d.MandateKey, cmd.Key.String())
	case d.Outcome == wire.OutcomeRejected:
		return "" // a rejection grants nothing, whatever the processor refused
	case d.Command != string(cmd.Type):
		return says("command", d.Command, string(cmd.Type))
	case cmd.Type == wire.CmdPropose && d.IdempotencyKey != cmd.IdempotencyKey:
		return says("idempotency key", d.IdempotencyKey, cmd.IdempotencyKey)
	case cmd.AuthorizationID() != "" && d.AuthorizationID != cmd.AuthorizationID():
		return says("authorization", d.AuthorizationID, cmd.AuthorizationID())
	}
	if cmd.Type.Signable() {
		return c.checkSigned(d, cmd)
	}
	return ""
}

// checkSigned verifies a grantor command's signature again, as the
// processor did, at the time the decision was made.
func (c *sourceChecker) checkSigned(d *wire.Decision, cmd *wire.Command) string {
	org := cmd.Key.Org
	sig := cmd.Signature
	if d.SignedBy == "" {
		if sig == nil && c.ring.Modes[org] == sink.SigningRequired {
			return fmt.Sprintf("it accepts an unsigned %s, but org %s requires signed grantor commands", cmd.Type, org)
		}
		return ""
	}
	if sig == nil {
		return fmt.Sprintf("it says the %s was signed by grantor key %q, but the record it answers carries no signature", cmd.Type, d.SignedBy)
	}
	if sig.KeyID != d.SignedBy {
		return fmt.Sprintf("it says the %s was signed by grantor key %q, but the record it answers is signed by %q", cmd.Type, d.SignedBy, sig.KeyID)
	}
	k, ok := c.ring.Keys[org][sig.KeyID]
	at := d.DecidedAt
	switch {
	case !ok:
		return fmt.Sprintf("it says the %s was signed by grantor key %q, which is not registered for org %s here (re-apply the grantor keys added after the backup, then recover)",
			cmd.Type, sig.KeyID, org)
	case !k.RevokedAt.IsZero() && !at.Before(k.RevokedAt):
		return fmt.Sprintf("grantor key %q of org %s was revoked at %s, before the decision (%s)", sig.KeyID, org, k.RevokedAt.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339))
	case at.Before(k.ValidFrom) || !k.ValidUntil.IsZero() && !at.Before(k.ValidUntil):
		return fmt.Sprintf("grantor key %q of org %s was not valid when the decision was made (%s)", sig.KeyID, org, at.UTC().Format(time.RFC3339))
	case !cmd.VerifySignature(k.PublicKey):
		return fmt.Sprintf("the signature by grantor key %q does not verify over the record it answers", sig.KeyID)
	}
	return ""
}
