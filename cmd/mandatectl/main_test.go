package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// asMandatectl makes the test binary run as mandatectl (main), so a test
// can run it as a process of its own and kill it (ctlProcess).
const asMandatectl = "MANDATECTL_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMandatectl) == "1" {
		main() // exits
	}
	goleak.VerifyTestMain(m)
}

// testBundle is one harness pipeline and the flags that point mandatectl at it.
type testBundle struct {
	h        *harness.Harness
	instance string
	kafka    []string // --brokers and the topic flags
	db       []string // --database-url
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: 3})
	b := &testBundle{h: h, instance: "ctl-instance-a"}
	b.kafka = []string{"--brokers", strings.Join(h.Brokers, ","),
		"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter}
	b.db = []string{"--database-url", h.DatabaseURL}
	return b
}

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

func ctl(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// send runs a command mandatectl produces and returns its decision (--json).
func (b *testBundle) send(t *testing.T, args ...string) (result, *wire.Decision) {
	t.Helper()
	r := ctl(t, append(append(args, "--json", "--timeout", "60s"), b.kafka...)...)
	if r.code == exitTimeout || r.code == exitUsage && r.stdout == "" {
		return r, nil
	}
	d, err := wire.ParseDecision([]byte(strings.TrimSpace(r.stdout)))
	require.NoError(t, err, "%s", r)
	return r, d
}

func (b *testBundle) grant(t *testing.T, org, mandate string, extra ...string) {
	t.Helper()
	r, d := b.send(t, append([]string{"grant", "--org", org, "--mandate", mandate, "--key", "grant-" + mandate,
		"--operation", "refund", "--max-amount", "20000", "--currency", "EUR", "--uses", "3"}, extra...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
}

func (b *testBundle) propose(t *testing.T, org, mandate, key string, amount int) (result, *wire.Decision) {
	t.Helper()
	return b.send(t, "propose", "--org", org, "--mandate", mandate, "--key", key, "--operation", "refund",
		"--amount", fmt.Sprint(amount), "--currency", "EUR", "--target", "customer-991")
}

// produced counts the records keyed key on the input topics.
func (b *testBundle) produced(t *testing.T, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []kgo.Opt{kgo.SeedBrokers(b.h.Brokers...)}
	n := 0
	for _, topic := range []string{b.h.Spec.Proposals, b.h.Spec.Grants} {
		for p := int32(0); p < b.h.Spec.Partitions; p++ {
			start, end, err := partitionBounds(ctx, opts, topic, p)
			require.NoError(t, err)
			require.NoError(t, scanRange(ctx, opts, topic, p, start, end, func(r *kgo.Record) {
				if string(r.Key) == key {
					n++
				}
			}, nil))
		}
	}
	return n
}

func TestMandatectl(t *testing.T) {
	b := setup(t)
	b.h.Start(b.instance)

	t.Run("a grant, propose, begin, commit round trip exits 0 at every step", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "acme", "case-1842")

		r, d := b.propose(t, "acme", "case-1842", "refund-1", 15000)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Equal(t, wire.OutcomeReserved, d.Outcome)
		require.NotNil(t, d.Authorization)
		auth := d.Authorization.ID
		require.Equal(t, b.h.Spec.Proposals, d.Source.Topic)

		r, d = b.send(t, "begin", "--mandate", "acme/case-1842", "--authorization", auth, "--executor", "worker-1:attempt-1")
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Equal(t, wire.OutcomeExecuting, d.Outcome)
		token := strconv.FormatInt(d.ExecutionToken, 10)
		require.Equal(t, "1", token)

		// Another executor is refused and told the winner; a commit without
		// the token is refused too.
		r, d = b.send(t, "begin", "--mandate", "acme/case-1842", "--authorization", auth)
		require.Equal(t, exitFailed, r.code, "%s", r)
		require.Equal(t, wire.ReasonAlreadyExecuting, d.Reason)
		require.Equal(t, "worker-1:attempt-1", d.HeldBy.Executor)
		r, d = b.send(t, "commit", "--mandate", "acme/case-1842", "--authorization", auth, "--external-ref", "re_guess")
		require.Equal(t, exitFailed, r.code, "%s", r)
		require.Equal(t, wire.ReasonStaleExecutionToken, d.Reason)

		// The human table, this time.
		r = ctl(t, append([]string{"commit", "--org", "acme", "--mandate", "case-1842", "--authorization", auth,
			"--external-ref", "re_3PqX9a2eZvKYlo2C1xQ", "--execution-token", token, "--result", `{"status":"succeeded"}`, "--timeout", "60s"}, b.kafka...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Regexp(t, `(?m)^outcome\s+committed$`, r.stdout)
		require.Contains(t, r.stdout, auth+" (committed, version 3)")
		require.Contains(t, r.stdout, "re_3PqX9a2eZvKYlo2C1xQ")
		require.Contains(t, r.stdout, "worker-1:attempt-1 (execution token 1)")
		require.Contains(t, r.stdout, `{"status":"succeeded"}`)
		require.Regexp(t, `(?m)^  operation\s+refund \d+\.\d\d EUR for `, r.stdout, "the amount by the currency's exponent")

		// The same intent again is the original authorization, replayed.
		r, d = b.propose(t, "acme", "case-1842", "refund-1", 15000)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Equal(t, wire.OutcomeReplayed, d.Outcome)
		require.Equal(t, auth, d.AuthorizationID)
	})

	t.Run("a denial exits 1 and says why", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "acme", "case-deny")
		r := ctl(t, append([]string{"propose", "--org", "acme", "--mandate", "case-deny", "--key", "too-much",
			"--operation", "refund", "--amount", "25000", "--currency", "EUR", "--target", "customer-991", "--timeout", "60s"}, b.kafka...)...)
		require.Equal(t, exitFailed, r.code, "%s", r)
		require.Regexp(t, `(?m)^outcome\s+denied$`, r.stdout)
		require.Regexp(t, `(?m)^reason\s+amount_exceeds_max$`, r.stdout)

		// A command that does not fit the state is refused: exit 1 too.
		r2, d := b.send(t, "begin", "--mandate", "acme/case-deny", "--authorization", "au_doesnotexist")
		require.Equal(t, exitFailed, r2.code, "%s", r2)
		require.Equal(t, wire.OutcomeRefused, d.Outcome)
	})

	t.Run("a bad flag exits 2 and produces nothing", func(t *testing.T) {
		t.Parallel()
		base := []string{"propose", "--org", "acme", "--mandate", "case-badflag", "--operation", "refund",
			"--target", "customer-991"}
		cases := []struct {
			name   string
			args   []string
			stderr string
		}{
			{"a lower-case currency is what the processor would reject", []string{"--key", "k1", "--amount", "100", "--currency", "eur"}, "currency_invalid"},
			{"a missing idempotency key is named by its flag", []string{"--amount", "100", "--currency", "EUR"}, "--key is required"},
			{"a missing amount is named by its flag", []string{"--key", "k1", "--currency", "EUR"}, "--amount is required"},
			{"a fractional amount is not minor units", []string{"--key", "k1", "--amount", "150.00", "--currency", "EUR"}, "invalid value"},
			{"a negative amount is what the processor would reject", []string{"--key", "k1", "--amount", "-5", "--currency", "EUR"}, "amount_invalid"},
			{"an unknown flag is a usage error", []string{"--key", "k1", "--amount", "100", "--currency", "EUR", "--amout", "1"}, "flag provided but not defined"},
			{"an org outside the grammar is refused", []string{"--key", "k1", "--amount", "100", "--currency", "EUR", "--org", "ACME"}, "org"},
		}
		for _, c := range cases {
			r := ctl(t, append(append(append([]string{}, base...), c.args...), b.kafka...)...)
			require.Equal(t, exitUsage, r.code, "%s: %s", c.name, r)
			require.Contains(t, r.stderr, c.stderr, c.name)
			require.Empty(t, r.stdout, c.name)
		}
		r := ctl(t, append([]string{"resolve", "--mandate", "acme/case-badflag", "--authorization", "au_x", "--outcome", "committed"}, b.kafka...)...)
		require.Equal(t, exitUsage, r.code, "%s", r)
		require.Contains(t, r.stderr, "--external-ref is required")
		require.Zero(t, b.produced(t, "acme/case-badflag"), "nothing may be produced")
	})

	t.Run("report-unknown puts an authorization in doubt, in-doubt lists it, resolve settles it", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "acme", "case-doubt")
		r, d := b.propose(t, "acme", "case-doubt", "doubt-1", 5000)
		require.Equal(t, exitOK, r.code, "%s", r)
		auth := d.Authorization.ID
		r, d = b.send(t, "begin", "--mandate", "acme/case-doubt", "--authorization", auth, "--executor", "worker-9")
		require.Equal(t, exitOK, r.code, "%s", r)
		token := d.ExecutionToken
		r, d = b.send(t, "report-unknown", "--mandate", "acme/case-doubt", "--authorization", auth, "--detail", "provider timed out",
			"--execution-token", strconv.FormatInt(token, 10))
		require.Equal(t, exitFailed, r.code, "in_doubt exits 1: %s", r)
		require.Equal(t, wire.OutcomeInDoubt, d.Outcome)

		r = ctl(t, append([]string{"in-doubt", "--older-than", "0s", "--org", "acme"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Contains(t, r.stdout, "acme/case-doubt")
		require.Contains(t, r.stdout, auth)
		require.Contains(t, r.stdout, "50.00 EUR", "5000 minor units are 50.00 EUR, by the currency's exponent")
		require.NotContains(t, r.stdout, "5000 EUR")
		require.Contains(t, r.stdout, "provider timed out")

		r = ctl(t, append([]string{"in-doubt", "--older-than", "1d", "--json"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		var none []inDoubtView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &none))
		require.Empty(t, none)

		// partitions counts it on the mandate's home partition.
		r = ctl(t, append(append([]string{"partitions", "--group", b.h.Group, "--json"}, b.kafka...), b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		var views []partitionView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &views))
		home := partitioner.MandateKey{Org: "acme", MandateID: "case-doubt"}.Partition(b.h.Spec.Partitions)
		require.GreaterOrEqual(t, views[home].InDoubt, int64(1))
		require.Greater(t, views[home].OldestDoubtSecs, 0.0)

		// reconcile lists it with its token and executor, refuses a decision
		// about another execution, and resolves it on the grants topic.
		r = ctl(t, append([]string{"reconcile", "--older-than", "0s", "--org", "acme"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Regexp(t, auth+`\s+`+strconv.FormatInt(token, 10)+`\s+worker-9\s`, r.stdout)
		r = ctl(t, append([]string{"reconcile", "--older-than", "0s", "--org", "acme", "--json"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		var listed []reconcileView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &listed))
		require.True(t, slices.ContainsFunc(listed, func(v reconcileView) bool {
			return v.AuthorizationID == auth && v.ExecutionToken == token && v.Executor == "worker-9"
		}), "%s", r.stdout)

		reconcile := func(extra ...string) (result, *wire.Decision) {
			args := append([]string{"reconcile", "--mandate", "acme/case-doubt", "--authorization", auth, "--json", "--timeout", "60s"}, extra...)
			r := ctl(t, append(append(args, b.kafka...), b.db...)...)
			d, err := wire.ParseDecision([]byte(strings.TrimSpace(r.stdout)))
			require.NoError(t, err, "%s", r)
			return r, d
		}
		r, d = reconcile("--committed", "re_found", "--execution-token", strconv.FormatInt(token+1, 10))
		require.Equal(t, exitFailed, r.code, "%s", r)
		require.Equal(t, wire.ReasonStaleExecutionToken, d.Reason, "a reconciliation naming a stale token is refused")
		require.Equal(t, wire.StateInDoubt, d.Authorization.State)
		r = ctl(t, append(append([]string{"reconcile", "--mandate", "acme/case-doubt", "--authorization", auth, "--cancelled", "--result", `{"a":1}`}, b.kafka...), b.db...)...)
		require.Equal(t, exitUsage, r.code, "a result is a committed effect's: %s", r)
		r = ctl(t, append(append([]string{"reconcile", "--mandate", "acme/case-doubt", "--authorization", auth, "--committed", "re_found", "--result", `[1]`}, b.kafka...), b.db...)...)
		require.Equal(t, exitUsage, r.code, "a result is a JSON object: %s", r)
		resultFile := filepath.Join(t.TempDir(), "result.json")
		require.NoError(t, os.WriteFile(resultFile, []byte("{\"refund\": \"re_found\", \"status\": \"succeeded\"}\n"), 0o600))
		r, d = reconcile("--committed", "re_found", "--evidence", "provider lists it", "--result-file", resultFile, "--reconciler", "mandatectl:ops")
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Equal(t, wire.OutcomeCommitted, d.Outcome)
		require.JSONEq(t, `{"refund":"re_found","status":"succeeded"}`, string(d.Authorization.Result), "the resolve records the provider's result")
		require.Equal(t, "mandatectl:ops", d.Authorization.ResolvedBy, "who resolved it")
		require.Equal(t, "provider lists it", d.Authorization.Detail, "the evidence")
		require.Equal(t, "provider timed out", d.Authorization.Reported, "what was reported stays")
		require.Equal(t, b.h.Spec.Grants, d.Source.Topic, "resolve is the control plane's")
		require.Equal(t, token, d.ExecutionToken)

		r = ctl(t, append([]string{"in-doubt", "--json"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		var left []inDoubtView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &left))
		for _, v := range left {
			require.NotEqual(t, auth, v.AuthorizationID)
		}
	})

	t.Run("revoke goes to the grants topic and exits 0", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "acme", "case-revoke")
		r, d := b.send(t, "revoke", "--mandate", "acme/case-revoke", "--reason", "case closed")
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Equal(t, wire.OutcomeRevoked, d.Outcome)
		require.Equal(t, b.h.Spec.Grants, d.Source.Topic)
		r, d = b.propose(t, "acme", "case-revoke", "after-revoke", 100)
		require.Equal(t, exitFailed, r.code, "%s", r)
		require.Equal(t, wire.OutcomeDenied, d.Outcome)
		require.Equal(t, wire.ReasonMandateRevoked, d.Reason)
	})

	t.Run("inspect shows the mandate, its authorization and its history", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "globex", "trip-7")
		r, d := b.propose(t, "globex", "trip-7", "hotel-1", 12000)
		require.Equal(t, exitOK, r.code, "%s", r)
		auth := d.Authorization.ID
		r, _ = b.send(t, "cancel", "--mandate", "globex/trip-7", "--authorization", auth, "--reason", "plans changed")
		require.Equal(t, exitOK, r.code, "%s", r)

		// inspect ORG/MANDATE, as a newcomer types it: the authorizations fit
		// 100 columns; -o wide shows every column.
		r = ctl(t, append(append([]string{"inspect", "globex/trip-7"}, b.kafka...), b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Regexp(t, auth+`\s+cancelled\s+120.00 EUR\s+customer-991`, r.stdout, "12000 minor units are 120.00 EUR")
		tableLines := strings.Split(r.stdout[strings.Index(r.stdout, "Authorizations"):strings.Index(r.stdout, "Decision history")], "\n")
		for _, line := range tableLines {
			require.LessOrEqual(t, utf8.RuneCountInString(line), 100, "the authorizations table fits 100 columns: %q", line)
		}

		args := append(append([]string{"inspect", "mandate", "globex/trip-7", "-o", "wide"}, b.kafka...), b.db...)
		r = ctl(t, args...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Contains(t, r.stdout, "Mandate globex/trip-7")
		require.Contains(t, r.stdout, "3 allowed")
		require.Regexp(t, auth+`\s+cancelled\s+\d+\s+120.00 EUR`, r.stdout, "-o wide: the version column too")
		require.Regexp(t, `max per use\s+200.00 EUR`, r.stdout)
		require.Contains(t, r.stdout, "Decision history")
		require.Regexp(t, `grant\s+granted`, r.stdout)
		require.Regexp(t, `propose\s+reserved`, r.stdout)
		require.Regexp(t, `cancel\s+cancelled`, r.stdout)

		r = ctl(t, append(args, "--json")...)
		require.Equal(t, exitOK, r.code, "%s", r)
		var out inspectJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
		require.NotNil(t, out.Mandate)
		require.Equal(t, int64(3), out.Mandate.UsesAllowed)
		require.Len(t, out.Authorizations, 1)
		require.Equal(t, auth, out.Authorizations[0].ID)
		require.Equal(t, "cancelled", out.Authorizations[0].State)
		require.Len(t, out.History, 3)
		require.True(t, out.HistoryScan.Complete)
		var outcomes []wire.Outcome
		for _, raw := range out.History {
			d, err := wire.ParseDecision(raw)
			require.NoError(t, err)
			require.Equal(t, "globex/trip-7", d.MandateKey)
			outcomes = append(outcomes, d.Outcome)
		}
		require.Equal(t, []wire.Outcome{wire.OutcomeGranted, wire.OutcomeReserved, wire.OutcomeCancelled}, outcomes)

		// --history keeps the most recent; --scan bounds the read.
		r = ctl(t, append(args, "--json", "--history", "1")...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
		require.Len(t, out.History, 1)
		require.Equal(t, 3, out.HistoryScan.Matched)

		r = ctl(t, append(append([]string{"inspect", "mandate", "globex/never-granted"}, b.kafka...), b.db...)...)
		require.Equal(t, exitFailed, r.code, "%s", r)
		require.Contains(t, r.stdout, "not in the database")
	})

	t.Run("tail --max N prints N decisions", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "initech", "tail-1")
		b.grant(t, "initech", "tail-2")
		b.grant(t, "initech", "tail-3")
		r := ctl(t, append([]string{"tail", "--from-beginning", "--org", "initech", "--max", "3", "--json", "--timeout", "60s"}, b.kafka...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 3)
		for _, l := range lines {
			d, err := wire.ParseDecision([]byte(l))
			require.NoError(t, err)
			require.Equal(t, "initech", d.Org)
		}

		r = ctl(t, append([]string{"tail", "--from-beginning", "--mandate", "initech/tail-2", "--max", "1", "--timeout", "60s"}, b.kafka...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		table := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, table, 2, "a header and one decision")
		require.Contains(t, table[0], "OUTCOME")
		require.Regexp(t, `initech/tail-2\s+grant\s+granted`, table[1])

		// --timeout before --max matching decisions: exit 3.
		r = ctl(t, append([]string{"tail", "--from-beginning", "--org", "initech", "--outcome", "conflict", "--max", "1", "--timeout", "2s"}, b.kafka...)...)
		require.Equal(t, exitTimeout, r.code, "%s", r)
	})

	t.Run("partitions shows the owning instance and its epoch", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "acme", "case-partitions")
		args := append(append([]string{"partitions", "--group", b.h.Group}, b.kafka...), b.db...)
		var views []partitionView
		// Every partition is claimed by the one instance once it has joined.
		testenv.WaitFor(t, 60*time.Second, func() bool {
			r := ctl(t, append(args, "--json")...)
			require.Equal(t, exitOK, r.code, "%s", r)
			views = nil
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &views))
			for _, v := range views {
				if !v.Claimed || v.GroupMember == "" || v.Moving {
					return false
				}
			}
			return len(views) == 3
		}, "all three partitions claimed and assigned")
		for _, v := range views {
			require.Equal(t, b.instance, v.Owner)
			require.NotEmpty(t, v.MemberID, "the KIP-848 group describes its member")
			require.Positive(t, v.MemberEpoch)
			require.GreaterOrEqual(t, v.Epoch, int64(1))
			require.LessOrEqual(t, v.ProposalsOffset, v.ProposalsEnd)
			require.GreaterOrEqual(t, v.OutboxBacklog, int64(0))
		}
		r := ctl(t, args...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Contains(t, r.stdout, "OWNER")
		require.Contains(t, r.stdout, "MOVING")
		for _, v := range views {
			require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+%s\s+%d\s`, v.Partition, b.instance, v.Epoch), r.stdout)
		}
	})

	t.Run("topics check compares the partition count with the database's", func(t *testing.T) {
		t.Parallel()
		b.grant(t, "acme", "case-topics") // a processor has recorded the count by now
		r := ctl(t, append(append([]string{"topics", "check"}, b.kafka...), b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Contains(t, r.stdout, "the database was set up for 3 partitions: it matches")
	})

	t.Run("parked lists parked outbox rows", func(t *testing.T) {
		t.Parallel()
		r := ctl(t, append([]string{"parked"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Contains(t, r.stdout, "no parked outbox rows")

		// The relay parks what the broker refuses for good; a row put there
		// by hand is listed the same way.
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, b.h.DatabaseURL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `INSERT INTO outbox_parked (partition, seq, epoch, kind, record_key, payload, reason, created_at)
			VALUES (2, 99999, 1, 0, 'acme/too-big', '\x7b7d', 'MESSAGE_TOO_LARGE', now())`)
		require.NoError(t, err)
		r = ctl(t, append([]string{"parked"}, b.db...)...)
		require.Equal(t, exitOK, r.code, "%s", r)
		require.Regexp(t, `(?m)^2\s+99999\s+decision\s+acme/too-big\s+2\s`, r.stdout)
		require.Contains(t, r.stdout, "MESSAGE_TOO_LARGE")
		r = ctl(t, append([]string{"parked", "--json"}, b.db...)...)
		var rows []parkedView
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
		require.Len(t, rows, 1)
		require.Equal(t, int64(99999), rows[0].Seq)
	})
}

func TestNoDecisionWithinTimeoutExits3(t *testing.T) {
	t.Parallel()
	b := setup(t) // topics, but no mandated instance to decide
	r := ctl(t, append([]string{"grant", "--mandate", "acme/nobody-home", "--operation", "refund", "--max-amount", "100",
		"--currency", "EUR", "--timeout", "3s"}, b.kafka...)...)
	require.Equal(t, exitTimeout, r.code, "%s", r)
	require.Contains(t, r.stderr, "no decision for "+b.h.Spec.Grants)

	r = ctl(t, append([]string{"grant", "--mandate", "acme/nobody-home", "--operation", "refund", "--max-amount", "100",
		"--currency", "EUR", "--no-wait"}, b.kafka...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "produced grant for acme/nobody-home to "+b.h.Spec.Grants)
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	r := ctl(t, "migrate", "--print")
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "-- migration 1: 0001_init.sql")
	require.Contains(t, r.stdout, "CREATE TABLE mandates")

	url := testenv.Database(t)
	r = ctl(t, "migrate", "--database-url", url)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "applied 0001_init.sql")
	r = ctl(t, "migrate", "--database-url", url)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "schema is up to date")

	r = ctl(t, "migrate")
	require.Equal(t, exitUsage, r.code, "%s", r)
	require.Contains(t, r.stderr, "MANDATED_DATABASE_URL")
}

func TestTokensCreateListRevoke(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	require.Equal(t, exitOK, ctl(t, "migrate", "--database-url", url).code)

	r := ctl(t, "tokens", "create", "acme", "--name", "refund-agent", "--json", "--database-url", url)
	require.Equal(t, exitOK, r.code, "%s", r)
	var created struct {
		TokenID string `json:"token_id"`
		Org     string `json:"org"`
		Name    string `json:"name"`
		Token   string `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &created), r.stdout)
	require.Equal(t, "acme", created.Org)
	require.True(t, strings.HasPrefix(created.Token, "mgw_"), created.Token)

	r = ctl(t, "tokens", "list", "--org", "acme", "--database-url", url)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, created.TokenID)
	require.Contains(t, r.stdout, "refund-agent")
	require.NotContains(t, r.stdout, created.Token, "the secret is never shown again")

	// Only the hash is stored.
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var stored []byte
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT token_hash FROM gateway_tokens WHERE token_id = $1`, created.TokenID).Scan(&stored))
	sum := sha256.Sum256([]byte(created.Token))
	require.Equal(t, sum[:], stored)

	require.Equal(t, exitOK, ctl(t, "tokens", "revoke", created.TokenID, "--database-url", url).code)
	r = ctl(t, "tokens", "list", "--json", "--database-url", url)
	require.Contains(t, r.stdout, `"revoked_at"`)
	r = ctl(t, "tokens", "revoke", "gt_aaaaaaaaaaaaaaaa", "--database-url", url)
	require.Equal(t, exitFailed, r.code)
	require.Equal(t, exitFailed, ctl(t, "tokens", "create", "Not-An-Org", "--database-url", url).code, "an org id is validated")
}

func TestTopics(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	names := []string{testenv.Name(t, "p"), testenv.Name(t, "g"), testenv.Name(t, "d"), testenv.Name(t, "dl")}
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, names...)
	})
	flags := []string{"--brokers", strings.Join(brokers, ","), "--proposals-topic", names[0], "--grants-topic", names[1],
		"--decisions-topic", names[2], "--dead-letter-topic", names[3]}

	r := ctl(t, append([]string{"topics", "check"}, flags...)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "is not usable")

	r = ctl(t, append([]string{"topics", "create", "--partitions", "2", "--replication-factor", "1", "--min-insync-replicas", "1"}, flags...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	for _, n := range names {
		require.Contains(t, r.stdout, "created "+n)
		require.Regexp(t, n+`\s+2\s+1\s+1\s+\S+\s+created`, r.stdout)
	}

	r = ctl(t, append([]string{"topics", "create", "--partitions", "2", "--replication-factor", "1"}, flags...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.NotContains(t, r.stdout, "created ")
	require.Regexp(t, names[0]+`\s+2\s+1\s+1\s+7d\s+existed`, r.stdout)

	r = ctl(t, append([]string{"topics", "create", "--partitions", "3", "--replication-factor", "1"}, flags...)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, names[0]+" has 2 partitions, not 3")

	r = ctl(t, append([]string{"topics", "check"}, flags...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "ok: 4 topics with 2 partitions each")

	r = ctl(t, append([]string{"topics", "create", "--replication-factor", "1"}, flags...)...)
	require.Equal(t, exitUsage, r.code, "%s", r)
	require.Contains(t, r.stderr, "--partitions is required")
}

func TestEveryCommandHasHelpWithExamples(t *testing.T) {
	t.Parallel()
	names := []string{"topics create", "topics check", "org-settings get", "org-settings set", "grantor-keys generate", "grantor-keys add",
		"grantor-keys revoke", "grantor-keys list", "grantor-keys require", "grantor-keys relax", "acls plan", "acls apply",
		"tokens", "tokens create", "tokens revoke", "tokens list",
		"decision-keys generate", "decision-keys add", "decision-keys revoke", "decision-keys list"}
	for n := range commands() {
		if n != "topics" && n != "grantor-keys" && n != "acls" && n != "tokens" && n != "decision-keys" {
			names = append(names, n)
		}
	}
	for _, n := range names {
		r := ctl(t, append(strings.Fields(n), "--help")...)
		require.Equal(t, exitOK, r.code, "%s: %s", n, r)
		require.Contains(t, r.stdout, "usage: mandatectl "+n, n)
		require.Contains(t, r.stdout, "Examples:\n  mandatectl ", n)
		require.Empty(t, r.stderr, n)
	}
	r := ctl(t, "--help")
	require.Equal(t, exitOK, r.code)
	for n := range commands() {
		require.Contains(t, r.stdout, "\n  "+n+" ")
	}
	r = ctl(t)
	require.Equal(t, exitUsage, r.code)
	r = ctl(t, "frobnicate")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, `unknown command "frobnicate"`)
}

// TestBuiltBinaryReadsTheDaemonsEnvironment runs mandatectl as operators do:
// a built binary configured only by the daemon's MANDATED_* variables.
func TestBuiltBinaryReadsTheDaemonsEnvironment(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "mandatectl")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	b := setup(t)
	b.h.Start("ctl-binary")
	cmd := exec.Command(bin, "grant", "--mandate", "acme/from-env", "--operation", "refund", "--max-amount", "100",
		"--currency", "EUR", "--timeout", "60s")
	cmd.Env = append(os.Environ(),
		"MANDATED_BROKERS="+strings.Join(b.h.Brokers, ","),
		"MANDATED_PROPOSALS_TOPIC="+b.h.Spec.Proposals, "MANDATED_GRANTS_TOPIC="+b.h.Spec.Grants,
		"MANDATED_DECISIONS_TOPIC="+b.h.Spec.Decisions, "MANDATED_DEAD_LETTER_TOPIC="+b.h.Spec.DeadLetter,
		"MANDATED_DATABASE_URL="+b.h.DatabaseURL,
		// A command's own flags never come from the environment.
		"MANDATED_AMOUNT=999999", "MANDATED_ORG=evil",
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Regexp(t, `(?m)^outcome\s+granted$`, stdout.String())
	require.Regexp(t, `(?m)^mandate\s+acme/from-env `, stdout.String())

	cmd = exec.Command(bin, "inspect", "mandate", "acme/from-env", "--no-history")
	cmd.Env = append(os.Environ(), "MANDATED_DATABASE_URL="+b.h.DatabaseURL)
	out, err = cmd.Output()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "Mandate acme/from-env")

	// Exit codes reach the shell.
	cmd = exec.Command(bin, "propose", "--mandate", "acme/from-env")
	cmd.Env = os.Environ()
	err = cmd.Run()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	require.Equal(t, exitUsage, exitErr.ExitCode())
}

func TestVerifyExitsZeroOnAVerifiedHistoryAndOneOnDrift(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start(b.instance)
	b.grant(t, "acme", "audited")
	r, d := b.propose(t, "acme", "audited", "refund-1", 15000)
	require.Equal(t, exitOK, r.code, "%s", r)
	part := d.Partition
	args := func(extra ...string) []string {
		return append(append([]string{"verify"}, extra...), append(append([]string(nil), b.kafka...), b.db...)...)
	}

	metrics := filepath.Join(t.TempDir(), "verify.prom")
	r = ctl(t, args("--metrics-file", metrics)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "verified: ")
	prom, err := os.ReadFile(metrics)
	require.NoError(t, err)
	require.Contains(t, string(prom), "mandated_verify_success 1")
	require.Contains(t, string(prom), "mandated_verify_last_completed_timestamp_seconds")
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+1\s+yes\s`, part), r.stdout, "the partition's history is complete")

	// A history missing its first record while retention deleted nothing
	// is a break: exit 1.
	copied := copyDecisions(t, b.h, part, 2)
	r = ctl(t, append(args("--partition", fmt.Sprint(part)), "--decisions-topic", copied)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stdout, fmt.Sprintf("BREAK partition %d sequence 2 (%s offset 0) sequence: the history starts at sequence 2", part, copied))

	// The checkpoints, one per partition with history, and a verify since them.
	r = ctl(t, args("--checkpoint")...)
	require.Equal(t, exitOK, r.code, "%s", r)
	lines := strings.Fields(r.stdout)
	require.NotEmpty(t, lines)
	require.Contains(t, r.stdout, fmt.Sprintf("%d:%d:%s:", part, d.Sequence, d.Hash))
	r, _ = b.propose(t, "acme", "audited", "refund-2", 100)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, args("--since", strings.Join(lines, ","), "--json")...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, `"breaks": []`)
	r = ctl(t, args("--partition", fmt.Sprint(part), "--since", d.Hash)...)
	require.Equal(t, exitOK, r.code, "%s", r)

	// A counter changed by hand: drift, named, exit 1.
	pool, err := pgxpool.New(context.Background(), b.h.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `SELECT set_config('mandated.partition', $1::int::text, true)`, part); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), `UPDATE mandates SET uses_held = 0, amount_held = 0 WHERE org = 'acme' AND mandate_id = 'audited'`)
		return err
	}))
	r = ctl(t, args("--metrics-file", metrics)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stdout, "DRIFT (database) acme/audited uses_held: the decisions say 2, PostgreSQL holds 0")
	require.Contains(t, r.stdout, "NOT VERIFIED")
	prom, err = os.ReadFile(metrics)
	require.NoError(t, err)
	require.Contains(t, string(prom), "mandated_verify_success 0")
	require.Contains(t, string(prom), `mandated_verify_drifts{kind="database"} 2`)

	// Usage errors exit 2.
	for _, bad := range [][]string{{"--since", "not-a-hash"}, {"--since", "1:2:3"}, {"--partition", "x"}, {"--since", d.Hash}} {
		r = ctl(t, args(bad...)...)
		require.Equal(t, exitUsage, r.code, "%v: %s", bad, r)
	}
}

// copyDecisions copies the decisions of partition p from sequence from on
// into a new topic of the same partition count (log start offset 0): a
// history that lost its first records without retention deleting them.
func copyDecisions(t *testing.T, h *harness.Harness, p int32, from int64) string {
	t.Helper()
	topic := testenv.Name(t, "copy")
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopic(ctx, h.Spec.Partitions, 1, nil, topic)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
	for _, r := range h.Decisions.Records() {
		if r.Partition != p || r.Seq < from {
			continue
		}
		var hdrs []kgo.RecordHeader
		for k, v := range r.Headers {
			hdrs = append(hdrs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Key: []byte(r.Key), Value: r.Value, Headers: hdrs}).FirstErr())
	}
	return topic
}
