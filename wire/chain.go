package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
)

// The decision chain. Every record mandated publishes for a partition — a
// decision on the decisions topic or a dead letter on the dead-letter topic,
// in one sequence — carries the hash of the partition's previous record
// (prev_hash) and its own (hash): SHA-256 over its canonical form, which
// includes prev_hash. Altering, dropping or inserting a record breaks the
// chain at that point for anyone who re-hashes it.
//
// A decision's canonical form is the exact JSON bytes published, minus the
// hash member. The encoder writes prev_hash and hash as the last two
// members, so a published decision ends with
//
//	,"prev_hash":"<64 lower-case hex>","hash":"<64 lower-case hex>"}
//
// and its canonical form is those bytes without the 75 bytes
// `,"hash":"<64 hex>"`: everything up to and including prev_hash's closing
// quote, then `}`. Every member the encoder writes is covered, including
// members added after this was written, without listing them.
//
// A dead letter's value is the original record's bytes, so its canonical
// form is a JSON object mandated builds from the record it publishes
// (DeadLetterCanonical) and its chain members travel in the headers
// mandated-prev-hash and mandated-hash.
//
// The first record after the chain began (migration 0008, or a partition's
// first claim) has prev_hash Anchor(partition, sequence before it).

// ChainHash is a SHA-256 in the chain.
type ChainHash [sha256.Size]byte

// String is the lower-case hex form used on the wire.
func (h ChainHash) String() string { return hex.EncodeToString(h[:]) }

// IsZero reports whether h is unset.
func (h ChainHash) IsZero() bool { return h == ChainHash{} }

// ParseChainHash parses 64 lower-case hex digits.
func ParseChainHash(s string) (ChainHash, error) {
	var h ChainHash
	if err := decodeLowerHex(h[:], []byte(s)); err != nil {
		return ChainHash{}, err
	}
	return h, nil
}

func decodeLowerHex(dst, src []byte) error {
	if len(src) != 2*len(dst) {
		return fmt.Errorf("a chain hash is %d lower-case hex digits, not %d characters", 2*len(dst), len(src))
	}
	for _, c := range src {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return errors.New("a chain hash is lower-case hex")
		}
	}
	_, err := hex.Decode(dst, src)
	return err
}

// Anchor is the prev_hash of the first chained record of a partition, the
// one after sequence after: SHA-256 of the ASCII text
// "mandated/chain/v1/partition/<partition>/after/<after>". It is recorded in
// the chain_anchors table when the chain starts.
func Anchor(partition int32, after int64) ChainHash {
	return sha256.Sum256(fmt.Appendf(nil, "mandated/chain/v1/partition/%d/after/%d", partition, after))
}

// Chain header names on dead letters (decisions carry the members in their
// JSON).
const (
	HeaderPrevHash = "mandated-prev-hash"
	HeaderHash     = "mandated-hash"
)

const (
	prevMember = `,"prev_hash":"`
	hashMember = `,"hash":"`
	// hashSuffix is `,"hash":"<64 hex>"}`.
	hashSuffix = len(hashMember) + 2*sha256.Size + 2
	// prevTail is `,"prev_hash":"<64 hex>"`.
	prevTail = len(prevMember) + 2*sha256.Size + 1
	// chainMembersLen is what Seal adds to an encoded decision.
	chainMembersLen = prevTail + hashSuffix - 1
)

// Seal appends the chain members to an encoded decision that has neither
// (it ends with '}') and returns the decision as published and its hash.
// It appends in place when encoded has the capacity.
func Seal(encoded []byte, prev ChainHash) ([]byte, ChainHash) {
	b := append(encoded[:len(encoded)-1], prevMember...)
	b = hex.AppendEncode(b, prev[:])
	b = append(b, '"', '}')
	h := ChainHash(sha256.Sum256(b))
	b = append(b[:len(b)-1], hashMember...)
	b = hex.AppendEncode(b, h[:])
	return append(b, '"', '}'), h
}

// Link is what a published record says about its place in the chain, and
// what re-hashing it gives.
type Link struct {
	Prev     ChainHash // its prev_hash
	Claimed  ChainHash // its hash as published
	Computed ChainHash // SHA-256 of its canonical form
}

// Intact reports whether the record's content matches its hash.
func (l Link) Intact() bool { return l.Claimed == l.Computed }

// ErrUnchained says a record carries no chain members where they must be.
var ErrUnchained = errors.New("no chain members")

// DecisionLink reads a published decision's chain members by position (the
// canonical form is defined on the bytes, not on a parse of them) and
// re-hashes its canonical form.
func DecisionLink(published []byte) (Link, error) {
	n := len(published)
	if n < hashSuffix+prevTail+1 || !bytes.HasSuffix(published, []byte(`"}`)) ||
		string(published[n-hashSuffix:n-hashSuffix+len(hashMember)]) != hashMember ||
		string(published[n-hashSuffix-prevTail:n-hashSuffix-prevTail+len(prevMember)]) != prevMember {
		return Link{}, fmt.Errorf("%w: a decision must end with ,\"prev_hash\":\"<hex>\",\"hash\":\"<hex>\"}", ErrUnchained)
	}
	var l Link
	if err := decodeLowerHex(l.Claimed[:], published[n-hashSuffix+len(hashMember):n-2]); err != nil {
		return Link{}, fmt.Errorf("hash: %w", err)
	}
	prevStart := n - hashSuffix - prevTail + len(prevMember)
	if err := decodeLowerHex(l.Prev[:], published[prevStart:prevStart+2*sha256.Size]); err != nil {
		return Link{}, fmt.Errorf("prev_hash: %w", err)
	}
	hs := sha256.New()
	hs.Write(published[:n-hashSuffix])
	hs.Write([]byte{'}'})
	hs.Sum(l.Computed[:0])
	return l, nil
}

// DeadLetter is what the chain covers of a dead letter: everything its
// record carries (the capped key and value, and the headers).
type DeadLetter struct {
	Partition       int32
	Sequence        int64
	Epoch           int64
	Reason          string
	Detail          string
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	Key             []byte // a null key hashes as an empty one
	Value           []byte
}

// DeadLetterCanonical is a dead letter's canonical form:
//
//	{"v":1,"kind":"dead_letter","partition":P,"sequence":S,"epoch":E,
//	 "reason":R,"detail":D,"source":{"topic":T,"partition":SP,"offset":SO},
//	 "key_sha256":"<hex>","value_sha256":"<hex>","prev_hash":"<hex>"}
//
// on one line without spaces, strings escaped as decisions' are, integers in
// decimal, hex lower-case.
func DeadLetterCanonical(d DeadLetter, prev ChainHash) []byte {
	b := make([]byte, 0, 384)
	b = append(b, `{"v":1,"kind":"dead_letter"`...)
	b = appendIntField(b, "partition", int64(d.Partition))
	b = appendIntField(b, "sequence", d.Sequence)
	b = appendIntField(b, "epoch", d.Epoch)
	b = appendStrField(b, "reason", d.Reason, false)
	b = appendStrField(b, "detail", d.Detail, false)
	b = append(b, `,"source":{"topic":`...)
	b = appendString(b, d.SourceTopic)
	b = appendIntField(b, "partition", int64(d.SourcePartition))
	b = appendIntField(b, "offset", d.SourceOffset)
	b = append(b, '}')
	k, v := sha256.Sum256(d.Key), sha256.Sum256(d.Value)
	b = append(b, `,"key_sha256":"`...)
	b = hex.AppendEncode(b, k[:])
	b = append(b, `","value_sha256":"`...)
	b = hex.AppendEncode(b, v[:])
	b = append(b, `","prev_hash":"`...)
	b = hex.AppendEncode(b, prev[:])
	return append(b, '"', '}')
}

// DeadLetterHash is SHA-256 of the dead letter's canonical form.
func DeadLetterHash(d DeadLetter, prev ChainHash) ChainHash {
	return sha256.Sum256(DeadLetterCanonical(d, prev))
}

// ParseInt64Header parses a decimal header value.
func ParseInt64Header(v []byte) (int64, error) { return strconv.ParseInt(string(v), 10, 64) }
