package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/mandated/mandated/processor/lifecycle"
	"github.com/mandated/mandated/sink"
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
	sink.Execer
	sink.Querier
}, org string, set map[string]bool) error {
	cur, err := sink.ReadOrgReplay(ctx, db, org)
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
	return sink.WriteOrgReplay(ctx, db, org, cur.Window, cur.Policy)
}

// printReplay prints an org's stored possible-replay setting.
func printReplay(ctx context.Context, w io.Writer, db sink.Querier, org string) error {
	rs, err := sink.ReadOrgReplay(ctx, db, org)
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

// runOrgSettingsReplay is a minimal `org-settings get|set ORG` carrying
// only the replay flags, for a tree without orgsettings.go; when that file
// is merged, its command takes these flags and this function goes.
func runOrgSettingsReplay(a *app, args []string) int {
	f := a.newFlagSet("org-settings", "get|set ORG [--replay-window D|off] [--replay-policy deny|flag] [flags]",
		`Show or change an org's settings.

Possible replays: for proposals without an intent, an org may set a replay
window. A proposal on the same mandate with the same operation, amount,
currency and target as an authorization that is committed or executing and
was reserved less than the window before, under another idempotency key, is
a possible replay (an agent restored from a checkpoint, repeating a call it
already made). --replay-policy deny answers it denied (possible_replay,
held_by the earlier authorization); flag decides it normally and names the
earlier authorization in possible_replay_of. Default: off. Running daemons
apply a change within 10 s.`,
		"mandatectl org-settings set acme --replay-window 10m --replay-policy deny",
		"mandatectl org-settings set acme --replay-policy flag",
		"mandatectl org-settings set acme --replay-window off",
		"mandatectl org-settings get acme")
	var db dbConn
	db.register(f)
	var replay replayFlags
	replay.register(f.FlagSet)
	timeout := f.Duration("timeout", 30*time.Second, "bound on the whole command")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) != 2 || (pos[0] != "get" && pos[0] != "set") {
		return f.usageErr("want get ORG or set ORG")
	}
	verb, org := pos[0], pos[1]
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if verb == "set" && !replay.given(set) {
		return f.usageErr("set needs --replay-window or --replay-policy")
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("org-settings: %v", err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if verb == "set" {
		if err := replay.apply(ctx, conn, org, set); err != nil {
			a.errorf("org-settings: %v", err)
			return exitFailed
		}
	}
	fmt.Fprintf(a.stdout, "org            %s\n", org)
	if err := printReplay(ctx, a.stdout, conn, org); err != nil {
		a.errorf("org-settings: %v", err)
		return exitFailed
	}
	return exitOK
}
