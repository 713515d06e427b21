package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// Recover re-derives, it does not believe. A record that continues a
// partition's chain past PostgreSQL's head proves only that its writer knew
// the head (the chain hash is plain SHA-256): anyone holding mandated's
// Kafka credential can write one. So recovery believes such a record only
//
//   - where a key of the deployment signed it (wire.VerifyRecordSignature:
//     a Kafka credential cannot sign), and
//   - where deciding again what it says it answers gives that very record:
//     the partition's input records are replayed, from the offsets and the
//     state PostgreSQL still holds, through the machine the processor runs
//     (lifecycle.Classify, the grantor signature check, State.Answer,
//     State.DeadLetter), each input in its topic's order, none skipped, at
//     the time the record says it was decided; a deadline's decision is
//     State.Tick of the authorization it names at that time, so it is the
//     state and the time that decide whether and how it applies, never the
//     record. The record is believed only if the decision re-derived,
//     encoded and hashed onto the record's predecessor, is the record's
//     hash: the same decision, the same views (mandate, authorization), the
//     same bindings, the same everything — except held_by, the
//     authorization a denial names as holding the authority, which depends
//     on what the processor's batch had loaded (it is taken from the
//     record: it changes nothing).
//
// The first record refused ends what is believed: every later one
// continues the chain from it. What recovery writes is the state the
// machine re-derived, never a view a record carries.

// rederiveChunk is how many records past the head are loaded for at once.
const rederiveChunk = 512

// rederiver re-decides one partition's records past PostgreSQL's head.
type rederiver struct {
	cfg      *RecoverConfig
	p        int32
	pool     *pgxpool.Pool // the partition's database
	keys     wire.DecisionKeyring
	grantors *sink.Keyring
	settings sink.OrgSettings
	intake   lifecycle.IntakeConfig
	st       *lifecycle.State
	inputs   map[string]*inputs
	decs     []*wire.Decision // the records, parsed (nil: a dead letter)
	loaded   int              // records [0, loaded) have had their needs loaded

	// The batch being re-decided: its time, and the rows its decisions
	// changed (stored, they come back at PostgreSQL's precision).
	batchAt time.Time
	touched touched
}

// touched is what one batch's decisions changed.
type touched struct {
	mandates map[partitioner.MandateKey]bool
	auths    map[lifecycle.AuthKey]bool
	idem     map[lifecycle.IdemScope]bool
	intents  map[lifecycle.IntentScope]bool
}

// inputs is one input topic's partition p, from the offset PostgreSQL
// stores on.
type inputs struct {
	topic      string
	start, lso int64
	records    []*kgo.Record // committed records from the stored offset on, in order
	next       int           // the next one to be answered
	stored     int64
}

// nextOffset is the offset the next input to be answered has, or the end
// of what was read.
func (in *inputs) nextOffset(readTo int64) int64 {
	if in.next < len(in.records) {
		return in.records[in.next].Offset
	}
	return readTo
}

// rederived is what re-deciding found.
type rederived struct {
	believed int    // records believed, from the first past the head
	why      string // why the next one is refused ("" when all are believed)
	epoch    int64  // the highest epoch of a believed record
	st       *lifecycle.State
	// offsets are the next input offsets after the believed records.
	proposals, grants int64
}

// rederive re-decides records (past the head, in chain order).
//
// Every epoch a record was decided under was claimed, and every claim is
// recorded (PostgreSQL's counter, or a signed claim on the decisions topic
// after its published mark: claimed, the highest of those): a record under
// a higher epoch is refused, whoever signed it.
func rederive(ctx context.Context, cfg *RecoverConfig, pool, control *pgxpool.Pool, head outbox.PostgresHead, claimed int64, records []outbox.Entry) (rederived, error) {
	ceiling := max(head.Epoch, claimed)
	r := &rederiver{cfg: cfg, p: head.Partition, pool: pool, inputs: map[string]*inputs{}}
	var err error
	if r.grantors, err = loadKeyring(ctx, control); err != nil {
		return rederived{}, err
	}
	if r.keys, err = sink.LoadDecisionKeys(ctx, control); err != nil {
		return rederived{}, err
	}
	if r.settings, err = sink.ReadOrgSettings(ctx, control); err != nil {
		return rederived{}, err
	}
	r.intake = lifecycle.IntakeConfig{ProposalsTopic: cfg.ProposalsTopic, GrantsTopic: cfg.GrantsTopic, Partitions: cfg.partitions,
		Limits: wire.Limits{MaxRecordBytes: cfg.MaxRecordBytes}}
	r.st = lifecycle.NewState(head.Partition, head.Epoch, head.LastSeq+1, r.retention)
	r.st.Replay = r.settings.Replay
	r.decs = make([]*wire.Decision, len(records))
	want := map[string]int64{}
	for i := range records {
		e := &records[i]
		src := e.Source
		if !e.DeadLetter {
			d, err := wire.ParseDecision(e.Value)
			if err != nil {
				continue // refused when it is reached
			}
			r.decs[i], src = d, d.Source
		}
		if src != nil && src.Partition == r.p {
			want[src.Topic] = max(want[src.Topic], src.Offset+1)
		}
	}
	if err := r.readInputs(ctx, head, want); err != nil {
		return rederived{}, err
	}

	out := rederived{}
	i := 0
	refuse := func(format string, args ...any) {
		e := &records[i]
		out.why = fmt.Sprintf("sequence %d (%s offset %d): %s", e.Seq, e.Topic, e.Offset, fmt.Sprintf(format, args...))
	}
	for i < len(records) && out.why == "" {
		if i >= r.loaded {
			if err := r.load(ctx, records, i); err != nil {
				return rederived{}, err
			}
		}
		e, d := &records[i], r.decs[i]
		if why := r.signed(e, d); why != "" {
			refuse("%s", why)
			break
		}
		if e.Epoch > ceiling {
			refuse("it was decided under epoch %d, which no claim recorded (PostgreSQL's epoch is %d, the highest claim on the decisions topic %d): mandated never decided under it",
				e.Epoch, head.Epoch, ceiling)
			break
		}
		if d != nil && !d.DecidedAt.Equal(r.batchAt) {
			r.commitBatch(d.DecidedAt)
		}
		var n int
		var why string
		switch {
		case e.DeadLetter:
			n, why = r.deadLetter(e)
		case d == nil:
			_, perr := wire.ParseDecision(e.Value)
			why = fmt.Sprintf("not a decision: %v", perr)
		case d.Source != nil:
			n, why = r.answer(records[i:], r.decs[i:])
		case d.Command == wire.CommandTimer:
			n, why = r.tick(e, d)
		default:
			why = fmt.Sprintf("a %s decision (%s) with no input: only a deadline's decision has none, and a consequence follows the answer it belongs to", d.Command, d.Outcome)
		}
		if why != "" {
			refuse("%s", why)
			break
		}
		for k := i; k < i+n; k++ {
			out.epoch = max(out.epoch, records[k].Epoch)
		}
		i += n
	}
	out.believed, out.st = i, r.st
	out.proposals, out.grants = head.ProposalsOffset, head.GrantsOffset
	if in := r.inputs[cfg.ProposalsTopic]; in != nil {
		out.proposals = max(out.proposals, in.answeredTo())
	}
	if in := r.inputs[cfg.GrantsTopic]; in != nil {
		out.grants = max(out.grants, in.answeredTo())
	}
	return out, nil
}

// answeredTo is the offset after the last input answered (the stored
// offset when none was).
func (in *inputs) answeredTo() int64 {
	if in.next == 0 {
		return in.stored
	}
	return in.records[in.next-1].Offset + 1
}

// retention is an org's idempotency retention, as the processors apply it.
func (r *rederiver) retention(org string) time.Duration {
	if d, ok := r.settings.Retention[org]; ok {
		return d
	}
	return r.cfg.Retention
}

// readInputs reads, per input topic, the committed records from the offset
// PostgreSQL stores up to the highest one a record past the head answers.
func (r *rederiver) readInputs(ctx context.Context, head outbox.PostgresHead, want map[string]int64) error {
	cl, err := kgo.NewClient(r.cfg.KafkaOpts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for topic, stored := range map[string]int64{r.cfg.ProposalsTopic: head.ProposalsOffset, r.cfg.GrantsTopic: head.GrantsOffset} {
		ends, err := adm.ListCommittedOffsets(ctx, topic)
		if err != nil {
			return fmt.Errorf("list the last stable offsets of %s: %w", topic, err)
		}
		end, ok := ends.Lookup(topic, r.p)
		if !ok || end.Err != nil {
			return fmt.Errorf("no last stable offset for %s/%d: %v", topic, r.p, end.Err)
		}
		starts, err := adm.ListStartOffsets(ctx, topic)
		if err != nil {
			return fmt.Errorf("list the start offsets of %s: %w", topic, err)
		}
		start, _ := starts.Lookup(topic, r.p)
		in := &inputs{topic: topic, start: max(start.Offset, 0), lso: end.Offset, stored: stored}
		r.inputs[topic] = in
		to := min(want[topic], in.lso)
		if stored < in.start || stored >= to {
			continue
		}
		err = outbox.ScanRange(ctx, r.cfg.KafkaOpts, topic, r.p, stored, to, func(rec *kgo.Record) error {
			in.records = append(in.records, rec)
			return nil
		}, nil)
		if err != nil {
			return fmt.Errorf("read back the input records of %s/%d: %w", topic, r.p, err)
		}
	}
	return nil
}

// input returns the input record src names if it is the next one of its
// topic not yet answered, or why not.
func (r *rederiver) input(src *wire.Source) (*inputs, *kgo.Record, string) {
	in, ok := r.inputs[src.Topic]
	if !ok || src.Partition != r.p {
		return nil, nil, fmt.Sprintf("it answers %s/%d, not an input partition of partition %d", src.Topic, src.Partition, r.p)
	}
	switch {
	case in.stored < in.start:
		return nil, nil, fmt.Sprintf("it answers %s/%d offset %d, but the records from offset %d on, which PostgreSQL had not decided, are gone (retention deleted up to %d): what it answers cannot be re-decided",
			src.Topic, src.Partition, src.Offset, in.stored, in.start)
	case src.Offset >= in.lso:
		return nil, nil, fmt.Sprintf("it answers %s/%d offset %d, at or past the last stable offset %d of that partition: no such record was ever committed",
			src.Topic, src.Partition, src.Offset, in.lso)
	}
	next := in.nextOffset(in.lso)
	switch {
	case src.Offset < next:
		return nil, nil, fmt.Sprintf("it answers %s/%d offset %d, an input already answered (PostgreSQL's or an earlier record's; the next one not answered is %d)",
			src.Topic, src.Partition, src.Offset, next)
	case src.Offset > next:
		return nil, nil, fmt.Sprintf("it answers %s/%d offset %d, but the input at offset %d comes first and was never answered: the processor answers every input, in order",
			src.Topic, src.Partition, src.Offset, next)
	}
	return in, in.records[in.next], ""
}

// signed says why a record is not signed by a key of the deployment valid
// when it was made, or "".
func (r *rederiver) signed(e *outbox.Entry, d *wire.Decision) string {
	at := e.Timestamp
	if d != nil {
		at = d.DecidedAt
	}
	if _, err := outbox.VerifyEntrySignature(e, r.keys, at); err != nil {
		return err.Error() + " (re-apply the decision keys added after the backup first: mandatectl decision-keys add)"
	}
	return ""
}

// deadLetter re-derives a dead letter: its input classifies as one, and the
// dead letter made of it hashes to the record's hash.
func (r *rederiver) deadLetter(e *outbox.Entry) (int, string) {
	if e.Source == nil {
		return 0, "a dead letter without the input it stands for"
	}
	in, rec, why := r.input(e.Source)
	if why != "" {
		return 0, why
	}
	it := lifecycle.Classify(r.intake, *e.Source, rec.Key, rec.Value)
	if it.Kind != lifecycle.ItemDeadLetter {
		return 0, fmt.Sprintf("it stands for %s/%d offset %d, but that record names a mandate: it is answered with a decision, never a dead letter",
			e.Source.Topic, e.Source.Partition, e.Source.Offset)
	}
	r.st.NextSeq, r.st.Epoch = e.Seq, e.Epoch
	dl := r.st.DeadLetter(it, rec.Key, rec.Value)
	if wire.DeadLetterHash(dl, e.Link.Prev) != e.Link.Claimed {
		return 0, fmt.Sprintf("it is not the dead letter of %s/%d offset %d (reason %s): another reason, detail, key or value", e.Source.Topic,
			e.Source.Partition, e.Source.Offset, dl.Reason)
	}
	in.next++
	return 1, ""
}

// answer re-decides the input records[0] answers, at the time it says,
// and compares what the machine gives with the records from there on (its
// answer, and the consequences before or after it).
func (r *rederiver) answer(records []outbox.Entry, decs []*wire.Decision) (int, string) {
	d := decs[0]
	in, rec, why := r.input(d.Source)
	if why != "" {
		return 0, why
	}
	it := lifecycle.Classify(r.intake, *d.Source, rec.Key, rec.Value)
	it.CheckSignature(r.grantors, d.DecidedAt)
	r.st.NextSeq, r.st.Epoch = d.Sequence, d.Epoch
	if it.Kind == lifecycle.ItemDeadLetter {
		return 0, fmt.Sprintf("it answers %s/%d offset %d with a decision, but no mandate can be read from that record (%s): it is answered with a dead letter",
			d.Source.Topic, d.Source.Partition, d.Source.Offset, it.Rej.Reason)
	}
	if d.Outcome == wire.OutcomeRejected && d.Reason == wire.ReasonStorageRefused {
		return r.storageRefused(in, it, records[0], d)
	}
	got := r.st.Answer(it, d.DecidedAt)
	r.touch(it.Cmd, got)
	n := min(len(got), len(records))
	for k := range n {
		if decs[k] == nil {
			return 0, fmt.Sprintf("re-deciding %s/%d offset %d gives %d decisions; the record at sequence %d is a dead letter", d.Source.Topic,
				d.Source.Partition, d.Source.Offset, len(got), records[k].Seq)
		}
		if why := sameRecord(&got[k], &records[k], decs[k]); why != "" {
			return 0, fmt.Sprintf("re-deciding %s/%d offset %d at %s gives another decision: %s", d.Source.Topic, d.Source.Partition, d.Source.Offset,
				d.DecidedAt.UTC().Format(time.RFC3339Nano), why)
		}
	}
	// Records past the last one published are decisions the restored
	// database lost and nobody saw (a batch the relay had published in part):
	// their state is the machine's all the same.
	in.next++
	return n, ""
}

// storageRefused believes a storage_refused rejection only where the
// database would refuse what the machine decides for the input: the effects
// leave a mandate breaking an invariant the database enforces. Nothing the
// machine decided is kept (it is decided on a copy).
func (r *rederiver) storageRefused(in *inputs, it lifecycle.Item, e outbox.Entry, d *wire.Decision) (int, string) {
	scratch := cloneState(r.st)
	scratch.Answer(it, d.DecidedAt)
	var broken error
	for _, m := range scratch.Mandates {
		if m.Dirty {
			if err := m.Check(); err != nil {
				broken = err
			}
		}
	}
	if broken == nil {
		return 0, "it says the database refused the input's effects, but deciding it again leaves every mandate valid: nothing for the database to refuse"
	}
	key := it.Key
	if it.Cmd != nil {
		key = it.Cmd.Key
	}
	typ := wire.CommandType(d.Command)
	got := r.st.Reject(key, &wire.Rejection{Reason: wire.ReasonStorageRefused, Key: &key, Type: typ, Detail: d.Detail}, *d.Source, it.SentAt, d.DecidedAt)
	if why := sameRecord(&got, &e, d); why != "" {
		return 0, "the database's refusal of its effects: " + why
	}
	in.next++
	return 1, ""
}

// tick re-derives a deadline's decision: the authorization it names must be
// due at the time it says, and applying its deadline must give the record.
func (r *rederiver) tick(e *outbox.Entry, d *wire.Decision) (int, string) {
	k, err := partitioner.ParseMandateKey(d.MandateKey)
	if err != nil {
		return 0, fmt.Sprintf("mandate %q: %v", d.MandateKey, err)
	}
	r.st.NextSeq, r.st.Epoch = d.Sequence, d.Epoch
	got := r.st.Tick(lifecycle.AuthKey{Mandate: k, ID: d.AuthorizationID}, d.DecidedAt)
	r.touch(nil, got)
	if len(got) != 1 {
		return 0, fmt.Sprintf("no deadline of authorization %q of mandate %s is due at %s: a deadline's decision is the state's and the time's, never a record's",
			d.AuthorizationID, d.MandateKey, d.DecidedAt.UTC().Format(time.RFC3339Nano))
	}
	if why := sameRecord(&got[0], e, d); why != "" {
		return 0, "applying the deadline gives another decision: " + why
	}
	return 1, ""
}

// sameRecord says how the decision re-derived differs from the record
// published, or "": encoded and hashed onto the record's predecessor, it
// must be the record's hash. held_by is taken from the record.
func sameRecord(got *wire.Decision, e *outbox.Entry, rec *wire.Decision) string {
	got.HeldBy = rec.HeldBy
	payload, err := got.Encode()
	if err != nil {
		return err.Error()
	}
	sealed, h := wire.Seal(payload, e.Link.Prev)
	if h == e.Link.Claimed {
		return ""
	}
	var a, b map[string]json.RawMessage
	_ = json.Unmarshal(sealed, &a)
	_ = json.Unmarshal(e.Value, &b)
	var diff []string
	for _, k := range slices.Sorted(maps.Keys(mergeKeys(a, b))) {
		if k == "hash" || k == "prev_hash" {
			continue
		}
		if !bytes.Equal(a[k], b[k]) {
			diff = append(diff, k)
		}
	}
	return fmt.Sprintf("%s %s, the record says %s %s (members that differ: %s)", got.Outcome, reasonText(got.Reason),
		rec.Outcome, reasonText(rec.Reason), strings.Join(diff, ", "))
}

func reasonText(r wire.Reason) string {
	if r == "" {
		return "(no reason)"
	}
	return string(r)
}

func mergeKeys(a, b map[string]json.RawMessage) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// load loads what the records from i on (a chunk of them) need.
func (r *rederiver) load(ctx context.Context, records []outbox.Entry, i int) error {
	end := min(i+rederiveChunk, len(records))
	needs := sink.NewNeeds()
	// Inputs are looked up without moving the cursors.
	next := map[string]int{}
	for topic, in := range r.inputs {
		next[topic] = in.next
	}
	for k := i; k < end; k++ {
		d := r.decs[k]
		if d == nil || d.Source == nil {
			if d != nil && d.Command == wire.CommandTimer {
				if mk, err := partitioner.ParseMandateKey(d.MandateKey); err == nil {
					needs.AddDeadline(lifecycle.AuthKey{Mandate: mk, ID: d.AuthorizationID})
				}
			}
			continue
		}
		in := r.inputs[d.Source.Topic]
		if in == nil || d.Source.Partition != r.p {
			continue
		}
		j := next[d.Source.Topic]
		for j < len(in.records) && in.records[j].Offset < d.Source.Offset {
			j++
		}
		if j >= len(in.records) || in.records[j].Offset != d.Source.Offset {
			continue
		}
		next[d.Source.Topic] = j + 1
		rec := in.records[j]
		it := lifecycle.Classify(r.intake, *d.Source, rec.Key, rec.Value)
		if it.Kind == lifecycle.ItemCommand {
			needs.AddCommand(it.Cmd, r.settings.Replay[it.Cmd.Key.Org], d.DecidedAt)
		}
		// A deadline the machine may apply on the way (an authorization
		// the command names, or one its key or intent is bound to) is
		// loaded with the command's needs.
	}
	err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return sink.LoadInto(ctx, tx, needs, r.st)
	})
	if err != nil {
		return err
	}
	r.loaded = end
	return nil
}

// cloneState copies a working state deeply enough for the machine to
// decide on the copy without touching the original.
func cloneState(st *lifecycle.State) *lifecycle.State {
	c := lifecycle.NewState(st.Partition, st.Epoch, st.NextSeq, st.Retention)
	c.Replay = st.Replay
	for k, m := range st.Mandates {
		cp := *m
		c.Mandates[k] = &cp
	}
	for k, a := range st.Auths {
		cp := *a
		c.Auths[k] = &cp
	}
	for k, i := range st.Idem {
		cp := *i
		c.Idem[k] = &cp
	}
	for k, i := range st.Intents {
		cp := *i
		c.Intents[k] = &cp
	}
	return c
}

// A batch's decisions are made on the state as the batch holds it in
// memory; the next batch reads it back from PostgreSQL, at its precision
// (timestamps to the microsecond). Records decided at another time than the
// one before are another batch's: the rows the previous batch changed are
// rounded as storing them would.
func (r *rederiver) commitBatch(at time.Time) {
	us := func(t *time.Time) { *t = t.Truncate(time.Microsecond) }
	for k := range r.touched.mandates {
		if m := r.st.Mandates[k]; m != nil {
			us(&m.ValidFrom)
			us(&m.ValidUntil)
			us(&m.CreatedAt)
			us(&m.UpdatedAt)
		}
	}
	for k := range r.touched.auths {
		if a := r.st.Auths[k]; a != nil {
			us(&a.Deadline)
			us(&a.ExecutionDeadline)
			us(&a.CreatedAt)
			us(&a.UpdatedAt)
		}
	}
	for k := range r.touched.idem {
		if i := r.st.Idem[k]; i != nil {
			us(&i.CreatedAt)
			us(&i.ExpiresAt)
		}
	}
	for k := range r.touched.intents {
		if i := r.st.Intents[k]; i != nil {
			us(&i.CreatedAt)
			us(&i.UpdatedAt)
			us(&i.ExpiresAt)
		}
	}
	r.batchAt = at
	r.touched = touched{mandates: map[partitioner.MandateKey]bool{}, auths: map[lifecycle.AuthKey]bool{},
		idem: map[lifecycle.IdemScope]bool{}, intents: map[lifecycle.IntentScope]bool{}}
}

// touch notes the rows a command's decisions (or a deadline's) changed.
func (r *rederiver) touch(cmd *wire.Command, ds []wire.Decision) {
	if r.touched.mandates == nil {
		r.commitBatch(r.batchAt)
	}
	for i := range ds {
		k, err := partitioner.ParseMandateKey(ds[i].MandateKey)
		if err != nil {
			continue
		}
		r.touched.mandates[k] = true
		if ds[i].AuthorizationID != "" {
			r.touched.auths[lifecycle.AuthKey{Mandate: k, ID: ds[i].AuthorizationID}] = true
		}
	}
	if cmd == nil {
		return
	}
	if scope, ok := lifecycle.ScopeOf(cmd); ok {
		r.touched.idem[scope] = true
	}
	if scope, ok := lifecycle.IntentScopeOf(cmd); ok {
		r.touched.intents[scope] = true
	}
}
