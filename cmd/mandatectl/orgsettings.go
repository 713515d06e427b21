package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/partitioner"
)

func orgSettingsCommand() *command {
	return group(&command{
		name:    "org-settings",
		group:   groupOps,
		summary: "show or change an org's settings (idempotency-key retention, possible-replay window and policy)",
		usage:   "get|set <org> [flags]",
		description: `  get   show an org's settings (its idempotency-key retention) and the
        longest hold window + execution timeout of its mandates
  set   change an org's settings; the running daemons apply them within a
        minute, without a restart

Examples:
  mandatectl org-settings get acme
  mandatectl org-settings set acme --retention 7d

Run 'mandatectl org-settings get --help' or 'mandatectl org-settings set --help'.`,
	},
		leaf(&command{
			name:    "get",
			summary: "show an org's settings and the longest hold window + execution timeout of its mandates",
			usage:   "<org> [--json] [flags]",
			description: `Show an org's settings: its idempotency-key retention (or that the daemon's
--idempotency-retention applies), and the longest hold window plus execution
timeout among its mandates, the shortest retention it may be given.`,
			examples: []string{
				"mandatectl org-settings get acme",
				"mandatectl org-settings get acme --json",
			},
		}, runOrgSettingsGet),
		leaf(&command{
			name:    "set",
			summary: "change an org's settings; the running daemons apply them without a restart",
			usage:   "<org> [--retention D] [--replay-window D|off] [--replay-policy deny|flag] [flags]",
			description: `Change an org's settings. --retention is how long the org's idempotency keys
are kept (the same intent within it is replayed; a key is kept longer while
its authorization can still move). It is refused below one hour and below the
hold window plus execution timeout of any of the org's mandates. The running
daemons read it within a minute; no restart.

--replay-window and --replay-policy govern possible replays of proposals
without an intent: a proposal on the same mandate with the same operation,
amount, currency and target as an authorization that is committed or
executing and was reserved less than the window before, under another
idempotency key. deny answers it denied (possible_replay, held_by the earlier
authorization); flag decides it normally and names the earlier one in
possible_replay_of. Default: off. Running daemons apply it within 10 s.`,
			examples: []string{
				"mandatectl org-settings set acme --retention 7d",
				"mandatectl org-settings set acme --retention 36h --json",
				"mandatectl org-settings set acme --replay-window 10m --replay-policy deny",
			},
		}, runOrgSettingsSet),
	)
}

type orgSettingsView struct {
	Org string `json:"org"`
	// RetentionSeconds is absent when the org has no override.
	RetentionSeconds      *float64 `json:"idempotency_retention_seconds,omitempty"`
	LongestWindowsSeconds float64  `json:"longest_mandate_windows_seconds"`
}

type orgSettingsGetOptions struct {
	db      dbConn
	asJSON  bool
	timeout time.Duration

	org string
}

func (o *orgSettingsGetOptions) register(f *flagSet) {
	o.db.register(f)
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of text")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the query")
}

func (o *orgSettingsGetOptions) validate(in given) (err error) {
	o.org, err = orgArg(in)
	return err
}

func runOrgSettingsGet(ctx context.Context, a *app, o *orgSettingsGetOptions) int {
	org := o.org
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	pool, err := o.db.pool(ctx)
	if err != nil {
		a.errorf("org-settings get: %v", err)
		return exitFailed
	}
	defer pool.Close()
	shards, closeShards, err := o.db.pools(ctx)
	if err != nil {
		a.errorf("org-settings get: %v", err)
		return exitFailed
	}
	defer closeShards()
	s, err := admin.NewOrgSettings(pool).WithShards(shards...).Get(ctx, org)
	if err != nil {
		a.errorf("org-settings get: %v", err)
		return exitFailed
	}
	printOrgSettings(a, s, o.asJSON)
	if !o.asJSON {
		if err := printReplay(ctx, a.stdout, pool, org); err != nil {
			a.errorf("org-settings get: %v", err)
			return exitFailed
		}
	}
	return exitOK
}

func printOrgSettings(a *app, s admin.OrgSetting, asJSON bool) {
	if asJSON {
		v := orgSettingsView{Org: s.Org, LongestWindowsSeconds: s.LongestWindows.Seconds()}
		if s.RetentionSet {
			secs := s.Retention.Seconds()
			v.RetentionSeconds = &secs
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
		return
	}
	tw := newTable(a.stdout)
	fmt.Fprintf(tw, "org\t%s\n", s.Org)
	if s.RetentionSet {
		fmt.Fprintf(tw, "idempotency retention\t%s\n", fmtAge(s.Retention))
	} else {
		fmt.Fprintf(tw, "idempotency retention\tnot set (the daemon's --idempotency-retention applies)\n")
	}
	if s.LongestWindows > 0 {
		fmt.Fprintf(tw, "longest mandate windows\t%s (hold + execution; the shortest retention allowed)\n", fmtAge(s.LongestWindows))
	} else {
		fmt.Fprintf(tw, "longest mandate windows\t- (no mandates)\n")
	}
	_ = tw.Flush()
}

type orgSettingsSetOptions struct {
	db        dbConn
	retention durationFlag
	replay    replayFlags
	asJSON    bool
	timeout   time.Duration

	org string
	set map[string]bool
}

func (o *orgSettingsSetOptions) register(f *flagSet) {
	o.db.register(f)
	f.Var(&o.retention, "retention", "idempotency-key retention (a `duration`: 36h, 7d)")
	o.replay.register(f.FlagSet)
	f.BoolVar(&o.asJSON, "json", false, "print the settings stored as JSON")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the change")
}

func (o *orgSettingsSetOptions) validate(in given) (err error) {
	if o.org, err = orgArg(in); err != nil {
		return err
	}
	o.set = in.set
	if o.retention.d == 0 && !o.replay.given(o.set) {
		return errors.New("set needs --retention, --replay-window or --replay-policy")
	}
	return nil
}

func runOrgSettingsSet(ctx context.Context, a *app, o *orgSettingsSetOptions) int {
	org, set := o.org, o.set
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	pool, err := o.db.writablePool(ctx)
	if err != nil {
		a.errorf("org-settings set: %v", err)
		return exitFailed
	}
	defer pool.Close()
	shards, closeShards, err := o.db.pools(ctx)
	if err != nil {
		a.errorf("org-settings set: %v", err)
		return exitFailed
	}
	defer closeShards()
	settings := admin.NewOrgSettings(pool).WithShards(shards...)
	if o.retention.d != 0 {
		if err := settings.SetRetention(ctx, org, o.retention.d); err != nil {
			a.errorf("org-settings set: %v", err)
			if errors.Is(err, admin.ErrRetentionTooShort) {
				return exitUsage
			}
			return exitFailed
		}
	}
	if o.replay.given(set) {
		if err := o.replay.apply(ctx, pool, org, set); err != nil {
			a.errorf("org-settings set: %v", err)
			return exitFailed
		}
	}
	s, err := settings.Get(ctx, org)
	if err != nil {
		a.errorf("org-settings set: %v", err)
		return exitFailed
	}
	printOrgSettings(a, s, o.asJSON)
	if !o.asJSON {
		if err := printReplay(ctx, a.stdout, pool, org); err != nil {
			a.errorf("org-settings set: %v", err)
			return exitFailed
		}
	}
	return exitOK
}

// orgArg is the one <org> argument.
func orgArg(in given) (string, error) {
	if len(in.args) != 1 {
		return "", errors.New("expected one <org> argument")
	}
	if !partitioner.ValidOrg(in.args[0]) {
		return "", fmt.Errorf("%q is not an org id ([a-z0-9][a-z0-9-]{0,62})", in.args[0])
	}
	return in.args[0], nil
}
