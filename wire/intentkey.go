package wire

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// intentKeyEncoding is RFC 4648 base32, lower case, without padding: the
// key stays inside the id grammar and reads the same in every language.
var intentKeyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// IntentKeyPrefix starts every key IntentKey returns.
const IntentKeyPrefix = "ik_"

// IntentKey derives an idempotency key from stable workflow facts: the
// orchestrator's run id, the step within the run and the action the step
// takes. The same facts give the same key in every process and after every
// restore from a checkpoint, so a retried or regenerated call replays its
// first answer instead of asking for authority again (seed 003: never a
// call-time UUID).
//
// The key is "ik_" followed by the lower-case, unpadded base32 of the first
// 20 bytes of SHA-256(run_id 0x00 step 0x00 action): 35 characters, inside
// the id grammar. Ids cannot contain NUL, so the separator keeps
// ("a", "bc") and ("ab", "c") apart. Any language can compute it:
//
//	"ik_" + base32(sha256(run_id + "\x00" + step + "\x00" + action)[:20]).lower().rstrip("=")
func IntentKey(runID, step, action string) string {
	h := sha256.New()
	h.Write([]byte(runID))
	h.Write([]byte{0})
	h.Write([]byte(step))
	h.Write([]byte{0})
	h.Write([]byte(action))
	sum := h.Sum(nil)
	var b strings.Builder
	b.Grow(len(IntentKeyPrefix) + intentKeyEncoding.EncodedLen(20))
	b.WriteString(IntentKeyPrefix)
	b.WriteString(intentKeyEncoding.EncodeToString(sum[:20]))
	return b.String()
}
