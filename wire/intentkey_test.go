package wire

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
)

// The vectors were computed independently with Python's hashlib and base64
// (the one-liner in IntentKey's doc), so another language's helper can be
// checked against the same table.
func TestIntentKeyMatchesDocumentedHash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ run, step, action, want string }{
		{"run-7f3a", "3", "payment.refund", "ik_ititxuqlgzodd47r55jnk7vcfo36tk6v"},
		{"a", "bc", "x", "ik_yokagy3knalxtw4ub64jt2o3zvycdxmu"},
		{"ab", "c", "x", "ik_6mayzns3qphix2aqxibkzowjysnelqdt"},
	} {
		got := IntentKey(tc.run, tc.step, tc.action)
		require.Equal(t, tc.want, got, "IntentKey(%q, %q, %q)", tc.run, tc.step, tc.action)
		require.True(t, partitioner.ValidID(got), "%q is an id of the wire grammar", got)
		require.Len(t, got, 35)
	}
}

func TestIntentKeySeparatesFieldBoundaries(t *testing.T) {
	t.Parallel()
	require.NotEqual(t, IntentKey("a", "bc", "x"), IntentKey("ab", "c", "x"))
	require.NotEqual(t, IntentKey("run", "1", "a"), IntentKey("run", "1", "b"))
	require.Equal(t, IntentKey("run", "1", "a"), IntentKey("run", "1", "a"))
}

// The shared golden vectors (testdata/intent_keys.json, computed with
// Python's hashlib) are read by this test and by the Python package's
// (clients/python/tests/test_intent_key.py): both languages derive the same
// key from the same facts, UTF-8 and empty fields included.
func TestIntentKeyMatchesTheSharedVectors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/intent_keys.json")
	require.NoError(t, err)
	var file struct {
		Vectors []struct {
			RunID  string `json:"run_id"`
			Step   string `json:"step"`
			Action string `json:"action"`
			Key    string `json:"key"`
		} `json:"vectors"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	require.GreaterOrEqual(t, len(file.Vectors), 8)
	for _, v := range file.Vectors {
		require.Equal(t, v.Key, IntentKey(v.RunID, v.Step, v.Action), "IntentKey(%q, %q, %q)", v.RunID, v.Step, v.Action)
	}
}
