package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/partitioner"
)

func runOrgSettings(a *app, args []string) int {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "get":
		return runOrgSettingsGet(a, args)
	case "set":
		return runOrgSettingsSet(a, args)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(a.stdout, orgSettingsUsage)
		return exitOK
	}
	fmt.Fprint(a.stderr, orgSettingsUsage)
	return exitUsage
}

const orgSettingsUsage = `usage: mandatectl org-settings get|set <org> [flags]

  get   show an org's settings (its idempotency-key retention) and the
        longest hold window + execution timeout of its mandates
  set   change an org's settings; the running daemons apply them within a
        minute, without a restart

Examples:
  mandatectl org-settings get acme
  mandatectl org-settings set acme --retention 7d

Run 'mandatectl org-settings get --help' or 'mandatectl org-settings set --help'.
`

type orgSettingsView struct {
	Org string `json:"org"`
	// RetentionSeconds is absent when the org has no override.
	RetentionSeconds      *float64 `json:"idempotency_retention_seconds,omitempty"`
	LongestWindowsSeconds float64  `json:"longest_mandate_windows_seconds"`
}

func runOrgSettingsGet(a *app, args []string) int {
	f := a.newFlagSet("org-settings get", "<org> [--json] [flags]",
		`Show an org's settings: its idempotency-key retention (or that the daemon's
--idempotency-retention applies), and the longest hold window plus execution
timeout among its mandates, the shortest retention it may be given.`,
		"mandatectl org-settings get acme",
		"mandatectl org-settings get acme --json")
	var db dbConn
	db.register(f)
	asJSON := f.Bool("json", false, "print JSON instead of text")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the query")
	org, code, ok := parseOrgArg(f, args)
	if !ok {
		return code
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	pool, err := db.pool(ctx)
	if err != nil {
		a.errorf("org-settings get: %v", err)
		return exitFailed
	}
	defer pool.Close()
	shards, closeShards, err := db.pools(ctx)
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
	printOrgSettings(a, s, *asJSON)
	if !*asJSON {
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

func runOrgSettingsSet(a *app, args []string) int {
	f := a.newFlagSet("org-settings set", "<org> [--retention D] [--replay-window D|off] [--replay-policy deny|flag] [flags]",
		`Change an org's settings. --retention is how long the org's idempotency keys
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
		"mandatectl org-settings set acme --retention 7d",
		"mandatectl org-settings set acme --retention 36h --json",
		"mandatectl org-settings set acme --replay-window 10m --replay-policy deny")
	var db dbConn
	db.register(f)
	var retention durationFlag
	f.Var(&retention, "retention", "idempotency-key retention (a `duration`: 36h, 7d)")
	var replay replayFlags
	replay.register(f.FlagSet)
	asJSON := f.Bool("json", false, "print the settings stored as JSON")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the change")
	org, code, ok := parseOrgArg(f, args)
	if !ok {
		return code
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if retention.d == 0 && !replay.given(set) {
		return f.usageErr("set needs --retention, --replay-window or --replay-policy")
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	pool, err := db.writablePool(ctx)
	if err != nil {
		a.errorf("org-settings set: %v", err)
		return exitFailed
	}
	defer pool.Close()
	shards, closeShards, err := db.pools(ctx)
	if err != nil {
		a.errorf("org-settings set: %v", err)
		return exitFailed
	}
	defer closeShards()
	settings := admin.NewOrgSettings(pool).WithShards(shards...)
	if retention.d != 0 {
		if err := settings.SetRetention(ctx, org, retention.d); err != nil {
			a.errorf("org-settings set: %v", err)
			if errors.Is(err, admin.ErrRetentionTooShort) {
				return exitUsage
			}
			return exitFailed
		}
	}
	if replay.given(set) {
		if err := replay.apply(ctx, pool, org, set); err != nil {
			a.errorf("org-settings set: %v", err)
			return exitFailed
		}
	}
	s, err := settings.Get(ctx, org)
	if err != nil {
		a.errorf("org-settings set: %v", err)
		return exitFailed
	}
	printOrgSettings(a, s, *asJSON)
	if !*asJSON {
		if err := printReplay(ctx, a.stdout, pool, org); err != nil {
			a.errorf("org-settings set: %v", err)
			return exitFailed
		}
	}
	return exitOK
}

// parseOrgArg parses flags and the one <org> argument.
func parseOrgArg(f *flagSet, args []string) (string, int, bool) {
	pos, code, ok := f.parse(args)
	if !ok {
		return "", code, false
	}
	if len(pos) != 1 {
		return "", f.usageErr("expected one <org> argument"), false
	}
	if !partitioner.ValidOrg(pos[0]) {
		return "", f.usageErr("%q is not an org id ([a-z0-9][a-z0-9-]{0,62})", pos[0]), false
	}
	return pos[0], exitOK, true
}

// writablePool opens a one-connection read-write pool (org-settings set:
// the only operator change besides migrate).
func (d *dbConn) writablePool(ctx context.Context) (*pgxpool.Pool, error) {
	u, err := d.resolve()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "60000"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}
