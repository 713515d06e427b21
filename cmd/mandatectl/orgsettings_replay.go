package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/lifecycle"
)

// The possible-replay flags of `mandatectl org-settings` (issue 13). They
// are kept apart from the command itself so that they plug into the
// org-settings command of cmd/mandatectl/orgsettings.go: register them on
// its flag set, apply them on set, print them on get.

// replayFlags are --replay-window and --replay-policy.
type replayFlags struct {
	window replayWindowFlag
	policy string
}

func (r *replayFlags) register(fs *flag.FlagSet) {
	fs.Var(&r.window, "replay-window", "possible-replay `window` for proposals without an intent: a duration (10m, 1h), or off (the default)")
	fs.StringVar(&r.policy, "replay-policy", "", "what a possible replay gets: deny (possible_replay, naming the earlier authorization) or flag (decided normally, with possible_replay_of)")
}

// given reports whether set names any of the replay flags.
func (r *replayFlags) given(set map[string]bool) bool {
	return set["replay-window"] || set["replay-policy"]
}

// apply stores the flags given, keeping the org's stored value for a flag
// not given.
func (r *replayFlags) apply(ctx context.Context, db interface {
	admin.Execer
	admin.Querier
}, org string, set map[string]bool) error {
	cur, err := admin.ReadOrgReplay(ctx, db, org)
	if err != nil {
		return err
	}
	if set["replay-window"] {
		cur.Window = r.window.d
	}
	if set["replay-policy"] {
		cur.Policy = lifecycle.ReplayPolicy(r.policy)
		if !cur.Policy.Valid() {
			return fmt.Errorf("--replay-policy must be deny or flag, not %q", r.policy)
		}
	}
	return admin.WriteOrgReplay(ctx, db, org, cur.Window, cur.Policy)
}

// printReplay prints an org's stored possible-replay setting.
func printReplay(ctx context.Context, w io.Writer, db admin.Querier, org string) error {
	rs, err := admin.ReadOrgReplay(ctx, db, org)
	if err != nil {
		return err
	}
	if rs.Window <= 0 {
		fmt.Fprintf(w, "replay_window  off\nreplay_policy  %s (applies once a window is set)\n", rs.Policy)
		return nil
	}
	fmt.Fprintf(w, "replay_window  %s\nreplay_policy  %s\n", rs.Window, rs.Policy)
	return nil
}

// replayWindowFlag is a duration, or "off" for none.
type replayWindowFlag struct{ d time.Duration }

func (f *replayWindowFlag) String() string {
	if f == nil || f.d == 0 {
		return "off"
	}
	return f.d.String()
}

func (f *replayWindowFlag) Set(s string) error {
	if s == "off" || s == "0" {
		f.d = 0
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("must be positive, or off")
	}
	f.d = d
	return nil
}
