package partitioner

import (
	"errors"
	"fmt"
	"strings"
)

// The id grammar. Orgs are lower case so that two spellings of one tenant can
// never name two tenants; the other ids allow the characters idempotency keys,
// UUIDs and provider references commonly use, and nothing that could be
// confused on a terminal (no spaces, no control characters, no non-ASCII).
// The checks are hand-written loops (this is on every record's path).
//
//	org: [a-z0-9][a-z0-9-]{0,62}
//	id:  [A-Za-z0-9][A-Za-z0-9._:-]{0,127}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isAlnum(c byte) bool { return isLowerAlnum(c) || c >= 'A' && c <= 'Z' }

// ErrInvalidKey is wrapped by every mandate-key parse error.
var ErrInvalidKey = errors.New("invalid mandate key")

// ValidOrg reports whether s is an org id: 1–63 of [a-z0-9-], starting with a
// letter or digit.
func ValidOrg(s string) bool {
	if len(s) == 0 || len(s) > 63 || !isLowerAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLowerAlnum(c) && c != '-' {
			return false
		}
	}
	return true
}

// ValidID reports whether s is a mandate, authorization or idempotency id:
// 1–128 of [A-Za-z0-9._:-], starting with a letter or digit.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 128 || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

// MandateKey identifies one mandate: the Kafka record key of every command
// and decision about it, "<org>/<mandate_id>".
type MandateKey struct {
	Org       string
	MandateID string
}

// NewMandateKey validates org and mandateID against the id grammar.
func NewMandateKey(org, mandateID string) (MandateKey, error) {
	if !ValidOrg(org) {
		return MandateKey{}, fmt.Errorf("%w: org %q is outside the grammar [a-z0-9][a-z0-9-]{0,62}", ErrInvalidKey, org)
	}
	if !ValidID(mandateID) {
		return MandateKey{}, fmt.Errorf("%w: mandate id %q is outside the grammar [A-Za-z0-9][A-Za-z0-9._:-]{0,127}", ErrInvalidKey, mandateID)
	}
	return MandateKey{Org: org, MandateID: mandateID}, nil
}

// ParseMandateKey parses "<org>/<mandate_id>".
func ParseMandateKey(s string) (MandateKey, error) {
	org, id, ok := strings.Cut(s, "/")
	if !ok {
		return MandateKey{}, fmt.Errorf("%w: %q has no '/' between org and mandate id", ErrInvalidKey, s)
	}
	return NewMandateKey(org, id)
}

// String returns "<org>/<mandate_id>".
func (k MandateKey) String() string { return k.Org + "/" + k.MandateID }

// Bytes returns the record key bytes.
func (k MandateKey) Bytes() []byte { return []byte(k.String()) }

// Partition returns the key's home partition among n partitions.
func (k MandateKey) Partition(n int32) int32 { return ForKey(k.Bytes(), n) }
