package lifecycle

import (
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// Intake: what happens to an input record before and around the state
// machine — decoding it, refusing one that is not at home on its partition
// or arrived on the wrong topic, checking a grantor command's signature —
// and which entry point of the machine answers it. It is pure, like the
// machine, and it is the one implementation: the processor classifies and
// answers every record it takes through it, and recovery (verify.Recover)
// re-decides the inputs the published decisions say they answer through it,
// believing a decision only where deciding the same input again gives the
// same record.

// IntakeConfig is what classifying a record depends on.
type IntakeConfig struct {
	ProposalsTopic, GrantsTopic string
	// Partitions is the topics' partition count: a mandate's home.
	Partitions int32
	// Limits are the processor's decoding limits.
	Limits wire.Limits
}

// ItemKind says which path a record takes.
type ItemKind int8

const (
	ItemCommand    ItemKind = iota // a valid command for a mandate at home here: Decide
	ItemReject                     // answered with a rejected decision: Reject
	ItemDeadLetter                 // no mandate key: a dead letter
)

// Item is one input record, classified.
type Item struct {
	Kind   ItemKind
	Cmd    *wire.Command   // ItemCommand
	Rej    *wire.Rejection // ItemReject, ItemDeadLetter
	Key    partitioner.MandateKey
	Home   int32 // ItemReject: the home partition of a misrouted record, else -1
	Source wire.Source
	SentAt time.Time
	// SignedBy is the grantor key whose signature verified (ItemCommand).
	SignedBy string
}

// Classify decodes the record at src (key and value) and decides which path
// it takes. A record that is not at home on its partition never reaches the
// machine, and authority (grant, revoke) and reconciliation (resolve) are
// accepted only from the grants topic, the privileged control plane.
func Classify(cfg IntakeConfig, src wire.Source, key, value []byte) Item {
	it := Item{Home: -1, Source: src}
	cmd, rej := wire.Decode(key, value, cfg.Limits)
	var mk *partitioner.MandateKey
	if rej != nil {
		mk = rej.Key
	} else {
		mk = &cmd.Key
		it.SentAt = cmd.SentAt
	}
	if mk != nil {
		if home := mk.Partition(cfg.Partitions); home != src.Partition {
			typ := rejType(cmd, rej)
			return reject(it, *mk, &wire.Rejection{Reason: wire.ReasonMisrouted, Key: mk, Type: typ,
				Detail: fmt.Sprintf("mandate %s lives on partition %d, not %d: produce with Kafka's default (murmur2) partitioner", mk, home, src.Partition)}, home)
		}
	}
	if rej != nil {
		if rej.Key == nil {
			it.Kind, it.Rej = ItemDeadLetter, rej
			return it
		}
		return reject(it, *rej.Key, rej, -1)
	}
	switch {
	case src.Topic == cfg.ProposalsTopic && cmd.Type.IsGrantorCommand():
		reason := wire.ReasonGrantOnProposals
		if cmd.Type == wire.CmdResolve {
			reason = wire.ReasonResolveOnProposals
		}
		return reject(it, cmd.Key, &wire.Rejection{Reason: reason, Key: mk, Type: cmd.Type,
			IdempotencyKey: cmd.IdempotencyKey, AuthorizationID: cmd.AuthorizationID(),
			Detail: fmt.Sprintf("%s is accepted only from the grants topic %s (the privileged control plane)", cmd.Type, cfg.GrantsTopic)}, -1)
	case src.Topic == cfg.GrantsTopic && !cmd.Type.IsGrantorCommand():
		return reject(it, cmd.Key, &wire.Rejection{Reason: wire.ReasonProposalOnGrants, Key: mk, Type: cmd.Type,
			IdempotencyKey: cmd.IdempotencyKey, AuthorizationID: cmd.AuthorizationID(),
			Detail: fmt.Sprintf("%s belongs on the proposals topic %s", cmd.Type, cfg.ProposalsTopic)}, -1)
	}
	it.Kind, it.Cmd = ItemCommand, cmd
	return it
}

func reject(it Item, key partitioner.MandateKey, rej *wire.Rejection, home int32) Item {
	it.Kind, it.Rej, it.Key, it.Home = ItemReject, rej, key, home
	return it
}

func rejType(cmd *wire.Command, rej *wire.Rejection) wire.CommandType {
	if cmd != nil {
		return cmd.Type
	}
	return rej.Type
}

// GrantorKey is a public key a grantor of an org signs with, and when it is
// valid.
type GrantorKey struct {
	PublicKey  ed25519.PublicKey
	ValidFrom  time.Time
	ValidUntil time.Time // zero: no end
	RevokedAt  time.Time // zero: not revoked
}

// GrantorKeyring is every grantor key and whether each org requires
// signed grantor commands (sink.Keyring, read from PostgreSQL).
type GrantorKeyring interface {
	GrantorKey(org, keyID string) (GrantorKey, bool)
	SigningRequired(org string) bool
}

// VerifyGrantorSignature checks a signable command's signature against
// ring at now. It returns the key id that signed it ("" for an accepted
// unsigned command), or the rejection that answers it.
func VerifyGrantorSignature(ring GrantorKeyring, cmd *wire.Command, now time.Time) (string, *wire.Rejection) {
	org := cmd.Key.Org
	refuse := func(reason wire.Reason, format string, args ...any) (string, *wire.Rejection) {
		key := cmd.Key
		return "", &wire.Rejection{Reason: reason, Key: &key, Type: cmd.Type, IdempotencyKey: cmd.IdempotencyKey,
			AuthorizationID: cmd.AuthorizationID(), Detail: fmt.Sprintf(format, args...)}
	}
	sig := cmd.Signature
	if sig == nil {
		if ring.SigningRequired(org) {
			return refuse(wire.ReasonSignatureMissing, "org %s requires signed %s commands (grant_signing=required): sign it with a grantor key registered for the org", org, cmd.Type)
		}
		return "", nil
	}
	k, ok := ring.GrantorKey(org, sig.KeyID)
	switch {
	case !ok:
		return refuse(wire.ReasonSignatureUnknownKey, "no grantor key %q is registered for org %s", sig.KeyID, org)
	case !k.RevokedAt.IsZero() && !now.Before(k.RevokedAt):
		return refuse(wire.ReasonSignatureKeyRevoked, "grantor key %q of org %s was revoked at %s", sig.KeyID, org, k.RevokedAt.UTC().Format(time.RFC3339))
	case now.Before(k.ValidFrom):
		return refuse(wire.ReasonSignatureKeyExpired, "grantor key %q of org %s is not valid before %s", sig.KeyID, org, k.ValidFrom.UTC().Format(time.RFC3339))
	case !k.ValidUntil.IsZero() && !now.Before(k.ValidUntil):
		return refuse(wire.ReasonSignatureKeyExpired, "grantor key %q of org %s expired at %s", sig.KeyID, org, k.ValidUntil.UTC().Format(time.RFC3339))
	case !cmd.VerifySignature(k.PublicKey):
		return refuse(wire.ReasonSignatureInvalid, "the signature by grantor key %q does not verify over this command's canonical form", sig.KeyID)
	}
	return sig.KeyID, nil
}

// CheckSignature checks a signable command's signature (ItemCommand; the
// others pass): a refused one becomes the rejection that answers it, an
// accepted one remembers its signer for the decisions.
func (it *Item) CheckSignature(ring GrantorKeyring, now time.Time) {
	if it.Kind != ItemCommand || !it.Cmd.Type.Signable() {
		return
	}
	signer, rej := VerifyGrantorSignature(ring, it.Cmd, now)
	if rej != nil {
		*it = reject(*it, it.Cmd.Key, rej, -1)
		it.Cmd = nil
		return
	}
	it.SignedBy = signer
}

// Answer decides an item (ItemCommand or ItemReject) at now: the decisions
// Decide or Reject returns, with the signer on every decision of a signed
// command and a misrouted record's home partition on its rejection.
func (st *State) Answer(it Item, now time.Time) []wire.Decision {
	switch it.Kind {
	case ItemCommand:
		ds := st.Decide(Input{Cmd: it.Cmd, Source: it.Source}, now)
		if it.SignedBy != "" {
			for i := range ds {
				ds[i].SignedBy = it.SignedBy
			}
		}
		return ds
	case ItemReject:
		d := st.Reject(it.Key, it.Rej, it.Source, it.SentAt, now)
		if it.Home >= 0 {
			home := it.Home
			d.HomePartition = &home
		}
		return []wire.Decision{d}
	}
	return nil
}

// DeadLetter is the dead letter of an item no mandate key can be read from
// (ItemDeadLetter), whose record had key and value: it takes the next
// sequence, and carries the record's bytes capped at wire.DeadLetterMaxByte.
func (st *State) DeadLetter(it Item, key, value []byte) wire.DeadLetter {
	seq := st.NextSeq
	st.NextSeq++
	capped := func(b []byte) []byte {
		if len(b) > wire.DeadLetterMaxByte {
			return b[:wire.DeadLetterMaxByte]
		}
		return b
	}
	return wire.DeadLetter{Partition: st.Partition, Sequence: seq, Epoch: st.Epoch, Reason: string(it.Rej.Reason), Detail: it.Rej.Detail,
		SourceTopic: it.Source.Topic, SourcePartition: it.Source.Partition, SourceOffset: it.Source.Offset,
		Key: capped(key), Value: capped(value)}
}
