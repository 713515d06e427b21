// Package failpoint provides named crash and delay points for fault tests,
// in the manner of etcd's gofail: code calls Inject("before_commit") at a
// point where a fault matters, and a test or an environment variable makes
// that point panic, kill the process, sleep or fail.
//
// MANDATED_FAILPOINTS="before_commit=kill;relay_after_produce_before_mark=2*sleep(500ms)"
//
// Actions: off, panic, kill (SIGKILL to the process itself), stop (SIGSTOP
// to the process itself: it stands still where it is until a SIGCONT),
// error (Inject returns ErrInjected), sleep(<duration>). A prefix N* limits an action to
// its next N hits; a prefix P% (P may be fractional, 0.5%) fires it with
// probability P percent. Disabled points
// cost one atomic load.
//
// It is a test seam, internal to the module: it must never import any
// package of mandated's (test/layout), and the contract and the state
// machine (wire, lifecycle) must never import it.
package failpoint

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Names of the points the code defines.
const (
	BeforeBatch                 = "before_batch"                    // processor: a batch's records in hand, its transaction not begun
	BeforeCommit                = "before_commit"                   // processor: writes done, COMMIT not sent
	AfterCommit                 = "after_commit"                    // processor: committed, nothing else done
	BeforeClaim                 = "before_claim"                    // processor: a partition assigned, epoch not yet bumped
	RelayAfterProduceBeforeMark = "relay_after_produce_before_mark" // relay: Kafka transaction committed, PostgreSQL not marked
	RelayBeforeProduce          = "relay_before_produce"            // relay: rows read, nothing produced
	RelayInTransaction          = "relay_in_transaction"            // relay: every record of the Kafka transaction produced, not committed
	RelayInMark                 = "relay_in_mark"                   // relay: published sequences written in PostgreSQL, not committed

	// mandatectl shards move (admin.MovePartition and the map file write):
	// each is a point where an operator's tool can die.
	MoveAfterFence  = "shards_move_after_fence"  // the source fenced the partition (moving_out); nothing copied
	MoveAfterCopy   = "shards_move_after_copy"   // the target committed the copy (moved_in); the source still says moving_out
	MoveAfterRecord = "shards_move_after_record" // the source recorded the partition moved_out; the map not written
	MapBeforeRename = "shard_map_before_rename"  // the new map is in a temporary file beside the map, not renamed over it
)

// EnvVar is read once at start by cmd/mandated.
const EnvVar = "MANDATED_FAILPOINTS"

// ErrInjected is returned by Inject for the "error" action.
var ErrInjected = errors.New("failpoint: injected error")

type action struct {
	kind      string // panic, kill, stop, error, sleep
	sleep     time.Duration
	remaining int64   // < 0: unlimited
	percent   float64 // 0 or 100: always
}

var (
	enabled atomic.Bool
	mu      sync.Mutex
	points  = map[string]*action{}
	hits    = map[string]*atomic.Int64{}
)

// Enable sets a point's action, in the syntax of the environment variable.
func Enable(name, spec string) error {
	a, err := parse(spec)
	if err != nil {
		return fmt.Errorf("failpoint %s: %w", name, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if a == nil {
		delete(points, name)
	} else {
		points[name] = a
	}
	enabled.Store(len(points) > 0)
	return nil
}

// Disable turns a point off.
func Disable(name string) { _ = Enable(name, "off") }

// Reset turns every point off.
func Reset() {
	mu.Lock()
	defer mu.Unlock()
	points = map[string]*action{}
	enabled.Store(false)
}

// EnableFromEnv parses "name=action;name=action".
func EnableFromEnv(value string) error {
	for _, part := range strings.Split(value, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, spec, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("failpoint: %q is not name=action", part)
		}
		if err := Enable(strings.TrimSpace(name), strings.TrimSpace(spec)); err != nil {
			return err
		}
	}
	return nil
}

// Hits returns how often a point fired.
func Hits(name string) int64 {
	mu.Lock()
	defer mu.Unlock()
	if h := hits[name]; h != nil {
		return h.Load()
	}
	return 0
}

func parse(spec string) (*action, error) {
	a := &action{remaining: -1}
	if n, rest, ok := strings.Cut(spec, "*"); ok {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("bad count in %q", spec)
		}
		a.remaining, spec = v, rest
	}
	if p, rest, ok := strings.Cut(spec, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v <= 0 || v > 100 {
			return nil, fmt.Errorf("bad percentage in %q", spec)
		}
		a.percent, spec = v, rest
	}
	switch {
	case spec == "off" || spec == "":
		return nil, nil
	case spec == "panic", spec == "kill", spec == "stop", spec == "error":
		a.kind = spec
	case strings.HasPrefix(spec, "sleep(") && strings.HasSuffix(spec, ")"):
		d, err := time.ParseDuration(spec[len("sleep(") : len(spec)-1])
		if err != nil {
			return nil, fmt.Errorf("bad duration in %q", spec)
		}
		a.kind, a.sleep = "sleep", d
	default:
		return nil, fmt.Errorf("unknown action %q (off, panic, kill, stop, error, sleep(d), with optional N* or P%% prefix)", spec)
	}
	return a, nil
}

// Armed reports whether a point has an action set (one atomic load when
// none is). Code that pays for giving a point its place (the processor
// sends COMMIT in its own round trip only for before_commit) asks first.
func Armed(name string) bool {
	if !enabled.Load() {
		return false
	}
	mu.Lock()
	defer mu.Unlock()
	return points[name] != nil
}

// Inject evaluates a point. It returns ErrInjected for "error", sleeps
// (bounded by ctx) for "sleep", returns once the process is continued for
// "stop", and never returns for "panic" and "kill".
func Inject(ctx context.Context, name string) error {
	if !enabled.Load() {
		return nil
	}
	mu.Lock()
	a := points[name]
	if a == nil || (a.percent > 0 && a.percent < 100 && rand.Float64()*100 >= a.percent) {
		mu.Unlock()
		return nil
	}
	if a.remaining == 0 {
		mu.Unlock()
		return nil
	}
	if a.remaining > 0 {
		a.remaining--
	}
	h := hits[name]
	if h == nil {
		h = &atomic.Int64{}
		hits[name] = h
	}
	h.Add(1)
	kind, sleep := a.kind, a.sleep
	mu.Unlock()

	switch kind {
	case "panic":
		panic("failpoint " + name)
	case "kill":
		fmt.Fprintf(os.Stderr, "failpoint %s: killing process %d\n", name, os.Getpid())
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not deliverable late; wait for it
	case "stop":
		// The whole process stops here, every goroutine with it (no
		// heartbeat, no timer): a process paused exactly at this point.
		fmt.Fprintf(os.Stderr, "failpoint %s: stopping process %d (SIGSTOP) until SIGCONT\n", name, os.Getpid())
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	case "error":
		return fmt.Errorf("%w at %s", ErrInjected, name)
	case "sleep":
		t := time.NewTimer(sleep)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
