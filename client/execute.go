package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mandated/mandated/wire"
)

// Errors of Execute.
var (
	// ErrInDoubt: the caller cannot know whether the effect happened (the
	// winner's outcome was not seen before the deadline, or the effect's
	// outcome is unknown and reported so). fn was not run by this call
	// unless the Execution says Ran.
	ErrInDoubt = errors.New("client: execution in doubt")
	// ErrOutcomeUnknown is what fn wraps when it cannot tell whether the
	// provider performed the effect (a timeout, a lost connection). Execute
	// then reports the outcome unknown: the use stays held until resolved.
	// Any other error from fn is treated the same way: failing closed.
	ErrOutcomeUnknown = errors.New("client: the effect's outcome is unknown")
	// ErrNotExecuted is what fn wraps when the provider definitely did not
	// perform the effect (it refused the request). Execute then cancels
	// with the error text as proof.
	ErrNotExecuted = errors.New("client: the effect was not executed")
	// ErrNotCommitted: the authorization ended without an effect (cancelled,
	// expired, revoked), or could not be begun.
	ErrNotCommitted = errors.New("client: the authorization was not committed")
)

// ErrReplayDiffers: Execute was handed the replay of an intent whose
// recorded authorization differs from the request (a *ReplayDiffersError):
// its result is not this request's, and fn was not run.
var ErrReplayDiffers = errors.New("client: the replayed authorization differs from this request")

// ReplayDiffersError is Execute's (and Read's) refusal of a replay that
// differs (issue 39 item 2): the decision answered this request with the
// intent's recorded authorization, whose Fields (sorted: "amount",
// "currency", "operation", "target") are not this request's. Execute sent
// nothing (no begin) and did not run fn. Presenting the recorded result as this
// request's would report done an effect that was not asked for; accept the
// fields with AcceptDiffers when the caller knows they were regenerated
// for the same action, or fork the intent to act on the new terms.
type ReplayDiffersError struct {
	Org             string
	MandateID       string
	AuthorizationID string   // the recorded authorization
	Fields          []string // what differs, sorted
}

func (e *ReplayDiffersError) Error() string {
	return fmt.Sprintf("client: this request differs from the recorded authorization %s of its intent in %s: its result is not this request's",
		e.AuthorizationID, strings.Join(e.Fields, ", "))
}

func (e *ReplayDiffersError) Unwrap() error { return ErrReplayDiffers }

// ErrInProgress: a loser found the execution begun by another executor and
// not finished within Config.LoserWait (a *InProgressError). errors.Is
// ErrInDoubt holds too: the caller cannot know the outcome yet.
var ErrInProgress = errors.New("client: the execution is in progress elsewhere")

// InProgressError is a loser's answer when the winner's execution has not
// finished within the bound the caller set (Config.LoserWait, or the
// context's deadline if sooner). fn was not run, and never will be by this
// call: repeat the call to get the outcome, or, from ReconcilableAt on
// (the execution deadline: the execution goes in doubt), an operator
// reconciles it.
type InProgressError struct {
	AuthorizationID string
	Executor        string    // the executor whose begin won
	Since           time.Time // when its execution began
	ReconcilableAt  time.Time // its execution deadline (zero if unknown)
	Decision        *Decision // the last decision seen about the authorization
	Cause           error     // why the wait ended (the bound, or the context)
}

func (e *InProgressError) Error() string {
	s := fmt.Sprintf("client: authorization %s is being executed by %q since %s", e.AuthorizationID, e.Executor, e.Since.Format(time.RFC3339Nano))
	if !e.ReconcilableAt.IsZero() {
		s += fmt.Sprintf(", reconcilable from %s", e.ReconcilableAt.Format(time.RFC3339Nano))
	}
	return s + fmt.Sprintf(": its outcome was not seen in time (%v); fn was not run", e.Cause)
}

func (e *InProgressError) Unwrap() []error {
	return []error{ErrInProgress, ErrInDoubt, e.Cause}
}

// CallOption changes one Execute or Read call.
type CallOption func(*callOptions)

type callOptions struct {
	acceptDiffers []string
}

func optionsOf(opts []CallOption) callOptions {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// AcceptDiffers lets Execute go on with a replay whose recorded
// authorization differs from the request in (only) these fields: the
// caller knows they are regenerated for the same action (a LangGraph fork
// that recomputes an amount), and takes the recorded outcome and result as
// the answer. Any other differing field is still refused. For Read, the
// field is "target": the caller takes the recorded answer to an earlier
// form of its question (a restored model that rephrased its query).
func AcceptDiffers(fields ...string) CallOption {
	return func(o *callOptions) { o.acceptDiffers = append(o.acceptDiffers, fields...) }
}

// Effect is what the side effect reports: the provider's reference, and a
// JSON object recorded with the commit when the server supports results.
type Effect struct {
	ExternalRef string
	Result      json.RawMessage
}

// ExecuteFunc performs the side effect. providerKey is the authorization id:
// pass it to the provider as its idempotency key (Stripe's Idempotency-Key,
// PayPal-Request-Id), so that even a provider call repeated outside mandated
// collapses into one effect.
type ExecuteFunc func(ctx context.Context, providerKey string) (Effect, error)

// Execution is what Execute observed.
type Execution struct {
	// Decision is the last decision about the authorization Execute saw:
	// for a committed execution, the commit (the winner's) or the decision
	// that showed it committed (a loser's).
	Decision *Decision
	// Ran is true for the one call that ran fn.
	Ran bool
	// ExternalRef and Result are the committed effect's, the same for the
	// winner and every loser.
	ExternalRef string
	Result      json.RawMessage
}

// Execute runs seed 002's protocol for one authorization in one call:
//
//   - it begins the authorization as a new, unique executor;
//   - the winner (the begin is answered executing) runs fn with the
//     authorization id as the provider's idempotency key, then commits with
//     the execution token and fn's result, cancels when fn wraps
//     ErrNotExecuted, and reports the outcome unknown for any other error;
//   - a loser (refused already_executing) never runs fn: it waits for the
//     winner's terminal outcome on the decisions topic and returns it, the
//     same external reference and result as the winner; when the winner's
//     execution has not finished within Config.LoserWait (5 s by default),
//     it returns an *InProgressError (errors.Is ErrInProgress and
//     ErrInDoubt) naming the executor, since when it executes and when it
//     becomes reconcilable, rather than waiting for the execution deadline;
//   - when ctx ends before the outcome is known, it returns ErrInDoubt and
//     has not run fn.
//
// A ref taken (RefOf) from the replay of an intent whose recorded
// authorization differs from the request (Decision.Differs) is refused
// before anything is sent, with a *ReplayDiffersError (errors.Is
// ErrReplayDiffers): the recorded result is not this request's. A caller
// that knows the fields are regenerated for the same action says so with
// AcceptDiffers(fields...) and gets the recorded outcome.
//
// With a server that hands out execution tokens (the executor boundary) the
// commit carries the token, so a winner paused past its execution timeout
// cannot commit over a later decision, and losers get the winner's recorded
// result. Against a server without tokens, the begin's compare-and-set still
// elects one winner, but a stale winner's commit is not fenced by a token
// and the result is not recorded: losers get the external reference only.
func (c *Client) Execute(ctx context.Context, auth AuthorizationRef, fn ExecuteFunc, opts ...CallOption) (*Execution, error) {
	o := optionsOf(opts)
	if differs := unaccepted(auth.Differs, o.acceptDiffers); len(differs) > 0 {
		return nil, &ReplayDiffersError{Org: auth.Org, MandateID: auth.MandateID, AuthorizationID: auth.AuthorizationID, Fields: differs}
	}
	executor, err := newExecutor()
	if err != nil {
		return nil, err
	}
	// Watch before the begin is produced: the winner's commit is decided
	// after our begin, so it cannot slip past unseen.
	w, stop := c.watch(auth.AuthorizationID)
	defer stop()

	d, err := c.Begin(ctx, Begin{AuthorizationRef: auth, Executor: executor})
	if err != nil {
		if errors.Is(err, ErrNoDecision) {
			// Our begin may yet win; nobody will run fn for it, and the
			// execution timeout will move it to in_doubt: never released
			// silently.
			return nil, fmt.Errorf("%w: no answer to begin: %w", ErrInDoubt, err)
		}
		return nil, err
	}
	switch {
	case d.Outcome == wire.OutcomeExecuting,
		d.Outcome == wire.OutcomeReplayed && d.OriginalOutcome == wire.OutcomeExecuting && d.State() == wire.StateExecuting:
		return c.runWinner(ctx, auth, d, fn)
	case d.Outcome == wire.OutcomeRefused && d.Reason == wire.ReasonAlreadyExecuting:
		wctx, cancel := context.WithTimeoutCause(ctx, c.cfg.LoserWait,
			fmt.Errorf("the loser's wait (LoserWait %s) ended", c.cfg.LoserWait))
		defer cancel()
		return c.awaitWinner(wctx, d, w)
	case d.State().Terminal() || d.State() == wire.StateInDoubt:
		return settled(d)
	default:
		return &Execution{Decision: d}, fmt.Errorf("%w: begin was answered %s %s: %s", ErrNotCommitted, d.Outcome, d.Reason, d.Detail)
	}
}

// unaccepted returns the fields of differs that accepted does not name.
func unaccepted(differs, accepted []string) []string {
	var out []string
	for _, f := range differs {
		if !slices.Contains(accepted, f) {
			out = append(out, f)
		}
	}
	return out
}

func newExecutor() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("client: executor id: %w", err)
	}
	return "ex-" + hex.EncodeToString(b), nil
}

func (c *Client) runWinner(ctx context.Context, auth AuthorizationRef, begun *Decision, fn ExecuteFunc) (*Execution, error) {
	token := begun.ExecutionToken()
	eff, fnErr := fn(ctx, auth.AuthorizationID)
	// The effect may have happened: record it even if the caller's deadline
	// has passed, bounded by SettleTimeout.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.SettleTimeout)
	defer cancel()
	var d *Decision
	var err error
	switch {
	case fnErr == nil:
		cm := Commit{AuthorizationRef: auth, ExternalRef: eff.ExternalRef, ExecutionToken: token}
		if token > 0 { // results are recorded by servers with the executor boundary
			cm.Result = eff.Result
		}
		d, err = c.Commit(sctx, cm)
	case errors.Is(fnErr, ErrNotExecuted):
		d, err = c.Cancel(sctx, Cancel{AuthorizationRef: auth, Reason: "not executed", NotExecutedProof: truncate(fnErr.Error(), 1000), ExecutionToken: token})
	default:
		d, err = c.ReportUnknown(sctx, ReportUnknown{AuthorizationRef: auth, Detail: truncate(fnErr.Error(), 1000), ExecutionToken: token})
		if err == nil {
			return &Execution{Decision: d, Ran: true}, fmt.Errorf("%w: %w", ErrInDoubt, fnErr)
		}
	}
	if err != nil {
		return &Execution{Ran: true, ExternalRef: eff.ExternalRef, Result: eff.Result},
			fmt.Errorf("%w: fn ran but its outcome was not recorded: %w", ErrInDoubt, err)
	}
	ex, serr := settled(d)
	ex.Ran = true
	if fnErr != nil && serr == nil {
		serr = fmt.Errorf("%w: %w", ErrNotCommitted, fnErr)
	}
	if d.State() == wire.StateCommitted && ex.Result == nil && token == 0 {
		ex.Result = eff.Result // not recorded by the server: only the winner has it
	}
	return ex, serr
}

// awaitWinner waits for a decision that shows the authorization settled,
// or in doubt: then only an operator settles it, and waiting on would only
// hold the caller until its deadline (a winner that died mid-execution is
// put in doubt by the execution timeout). The refusal itself may already
// show it (a begin after the winner committed is refused with the winner's
// outcome and result). ctx carries the loser's bound: when it ends while
// the execution still runs, the answer is an *InProgressError.
func (c *Client) awaitWinner(ctx context.Context, last *Decision, w *watcher) (*Execution, error) {
	if last.State().Terminal() || last.State() == wire.StateInDoubt {
		return settled(last)
	}
	for {
		for _, d := range w.take() {
			if d.Authorization == nil {
				continue
			}
			last = d
			if d.State().Terminal() || d.State() == wire.StateInDoubt {
				return settled(d)
			}
		}
		select {
		case <-w.signal:
		case <-ctx.Done():
			if a := last.Authorization; a != nil && a.State == wire.StateExecuting {
				ip := &InProgressError{AuthorizationID: a.ID, Executor: a.Executor, Since: a.UpdatedAt, Decision: last, Cause: context.Cause(ctx)}
				if a.ExecutionDeadline != nil {
					ip.ReconcilableAt = *a.ExecutionDeadline
				}
				return &Execution{Decision: last}, ip
			}
			return &Execution{Decision: last}, fmt.Errorf("%w: the winner's outcome was not seen before the deadline (last state %s); fn was not run: %w",
				ErrInDoubt, last.State(), context.Cause(ctx))
		}
	}
}

// settled turns a decision about a settled (or in-doubt) authorization into
// Execute's answer.
func settled(d *Decision) (*Execution, error) {
	ex := &Execution{Decision: d}
	switch d.State() {
	case wire.StateCommitted:
		ex.ExternalRef = d.Authorization.ExternalRef
		ex.Result = d.Result()
		return ex, nil
	case wire.StateInDoubt, wire.StateExecuting:
		return ex, fmt.Errorf("%w: the authorization is %s", ErrInDoubt, d.State())
	default:
		return ex, fmt.Errorf("%w: the authorization is %s (%s %s)", ErrNotCommitted, d.State(), d.Outcome, d.Reason)
	}
}

// truncate makes s a free-text field the wire accepts: printable, without
// control characters, at most n bytes.
func truncate(s string, n int) string {
	b := []rune{}
	size := 0
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			r = ' '
		}
		if size += len(string(r)); size > n {
			break
		}
		b = append(b, r)
	}
	return string(b)
}
