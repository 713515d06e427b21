package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/sink/shardmap"
)

func shardsCommand() *command {
	return group(&command{
		name:    "shards",
		group:   groupOps,
		summary: "move a partition to another shard; drop the copy a move left (move, drop-moved, moves)",
		usage:   "<move|drop-moved|moves> [flags]",
		description: `  move P --to SHARD_OR_URL --shard-map FILE    move partition P to another shard, fenced like a takeover
  drop-moved P --shard SHARD --shard-map FILE  delete the read-only copy a move left on the source
  moves --shard-map FILE                       list the moves every shard records

Examples:
  mandatectl shards move 3 --to b --shard-map /etc/mandated/shards.yaml
  mandatectl shards drop-moved 3 --shard a --shard-map /etc/mandated/shards.yaml

Run 'mandatectl shards <subcommand> --help' for flags and examples
(docs/runbooks.md, "Moving a partition to another shard").`,
	},
		leaf(&command{
			name:    "move",
			summary: "move partition P to another shard, fenced like a takeover",
			usage:   "P --to SHARD_OR_URL [--name NEW] --shard-map FILE [flags]",
			description: `Move partition P, with every row it has, to another shard, while mandated
runs. Fenced like a takeover: (1) on the shard holding P, P's epoch is bumped
and P is marked moving, so its owner's next commit fails its fence and
nothing of P is written there any more (claims, batches and relay marks of P
are refused: "partition P moved to shard X"); (2) every row of P (mandates,
authorizations, idempotency keys, intents, outbox and parked rows, the
partition row with its offsets, sequence and epoch, relay progress, chain
anchor) is copied from one repeatable-read snapshot into the target in one
transaction, in which the target takes P with a higher epoch; (3) the source
records P moved out; (4) the shard map file is rewritten (temporary file,
then rename) with P in the target's set. Running processors reload the map
when refused and claim P on the target; SIGHUP reloads it too. The old copy
stays, read-only, until 'mandatectl shards drop-moved'.

The map file is locked (flock on FILE.lock beside it) from the first read
to the write: a second move or repartition of the same map waits for the
first, then starts from the map the first wrote, so no edit is lost.

--to is a shard of the map, or the URL of a database for a new shard (then
--name names it; migrate it first with 'mandatectl migrate --database-url').
Refused, with nothing changed: P not on its shard, P moving to another
shard, another move of P running, the target not migrated, of another
partition count, not answering, already holding rows of P, the map file not
writable. A copy that fails is undone (P stays where it was).

Interrupted at any point (the tool killed, a database gone, the map write
failed), the same command run again completes the move from what the two
databases record: it copies what was fenced and not copied, records what
was copied and not recorded, and writes the map where only the map is
missing; nothing is copied twice. --resume is accepted and does the same.
Nothing printed carries a password of the map or of --to.`,
			examples: []string{
				"mandatectl shards move 3 --to b --shard-map /etc/mandated/shards.yaml",
				"mandatectl shards move 7 --to postgres://mandated@db-c:5432/mandated --name c --shard-map shards.yaml",
			},
		}, runShardsMove),
		leaf(&command{
			name:    "drop-moved",
			summary: "delete the read-only copy a move left on the source",
			usage:   "P --shard SHARD --shard-map FILE",
			description: `Delete the read-only copy of partition P that a move left on shard SHARD
(every table's rows of P there), once the move is done. P stays recorded as
moved away, so it is never claimed there again, whatever map a process runs
with. Refused while the move is not finished, or where P did not move away.`,
			examples: []string{"mandatectl shards drop-moved 3 --shard a --shard-map /etc/mandated/shards.yaml"},
		}, runShardsDropMoved),
		leaf(&command{
			name:        "moves",
			summary:     "list the moves every shard records",
			usage:       "--shard-map FILE",
			description: `List the partition moves every shard of the map records.`,
			examples:    []string{"mandatectl shards moves --shard-map /etc/mandated/shards.yaml"},
		}, runShardsMoves),
	)
}

// runShards runs 'mandatectl shards args...' as a (the tests give it hooks).
func runShards(a *app, args []string) int {
	return newTree().sub("shards").execute(a, args)
}

func shardMapFlag(f *flagSet, path *string) {
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(path, "shard-map", "", "the daemon's shard map (YAML) (required)")
	})
}

func partitionArg(pos []string) (int32, bool) {
	if len(pos) != 1 {
		return 0, false
	}
	p, err := strconv.ParseInt(pos[0], 10, 32)
	if err != nil || p < 0 {
		return 0, false
	}
	return int32(p), true
}

type shardsMoveOptions struct {
	mapPath, to, name string
	resume            bool // accepted, and what a plain re-run does anyway
	timeout           time.Duration

	p int32
}

func (o *shardsMoveOptions) register(f *flagSet) {
	shardMapFlag(f, &o.mapPath)
	f.StringVar(&o.to, "to", "", "the target: a shard of the map, or a database URL for a new shard (required)")
	f.StringVar(&o.name, "name", "", "the new shard's name when --to is a URL")
	f.BoolVar(&o.resume, "resume", false, "complete an interrupted move (a plain re-run does the same; kept for scripts)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on the whole move, waiting for the map's lock included")
}

func (o *shardsMoveOptions) validate(in given) error {
	var ok bool
	if o.p, ok = partitionArg(in.args); !ok {
		return errors.New("want one partition number")
	}
	if o.mapPath == "" || o.to == "" {
		return errors.New("--shard-map and --to are required")
	}
	if _, err := shardmap.Read(o.mapPath); err != nil {
		return fmt.Errorf("--shard-map: %w", err)
	}
	return nil
}

func runShardsMove(ctx context.Context, a *app, o *shardsMoveOptions) int {
	p, mapPath, to, name := o.p, o.mapPath, o.to, o.name
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()

	// Everything from here to the map write holds the map's lock, and reads
	// the map again under it: another edit that ran meanwhile is kept.
	lock, err := shardmap.Lock(ctx, mapPath, func(holder string) {
		a.errorf("shards move: waiting for the shard map's lock %s, held by %s", shardmap.LockPath(mapPath), cmp.Or(holder, "another edit"))
		call(a.hooks.mapLockWait)
	})
	if err != nil {
		a.errorf("shards move: %v (nothing was changed)", err)
		return exitFailed
	}
	defer lock.Unlock() //nolint:errcheck // released with the file anyway
	m, err := shardmap.Read(mapPath)
	if err != nil {
		return a.usageErr("--shard-map: %v", err)
	}
	raw, err := os.ReadFile(mapPath)
	if err != nil {
		a.errorf("shards move: %v", err)
		return exitFailed
	}
	call(a.hooks.mapRead)
	si := m.For(p)
	if si < 0 {
		return a.usageErr("the shard map gives partition %d to no shard", p)
	}
	source := m.Shards[si]
	targetName, targetURL, newURL := to, "", ""
	if strings.Contains(to, "://") {
		if name == "" {
			return a.usageErr("--to is a URL: --name names the new shard")
		}
		targetName, targetURL, newURL = name, to, to
		for _, s := range m.Shards {
			if s.Name == targetName {
				return a.usageErr("the shard map names a shard %s already: --to %s", targetName, targetName)
			}
		}
	} else {
		for _, s := range m.Shards {
			if s.Name == targetName {
				targetURL = s.URL
			}
		}
		if targetURL == "" {
			return a.usageErr("the shard map names no shard %q (a new shard: --to URL --name NAME)", targetName)
		}
	}
	if targetName == source.Name {
		a.errorf("shards move: partition %d is on shard %s already", p, source.Name)
		return exitFailed
	}
	edited, err := shardmap.MoveIn(raw, p, targetName, newURL)
	if err != nil {
		a.errorf("shards move: %v", err)
		return exitFailed
	}
	if err := shardmap.CheckWritable(mapPath); err != nil {
		a.errorf("shards move: %v (nothing was changed)", err)
		return exitFailed
	}
	res, err := admin.MovePartition(ctx, admin.MoveOptions{Partition: p, Source: source.URL, Target: targetURL, TargetName: targetName})
	if err != nil {
		a.errorf("shards move: %v", err)
		return exitFailed
	}
	call(a.hooks.beforeMapWrite)
	if err := shardmap.WriteFileAtomic(mapPath, edited); err != nil {
		// Never the map itself: its url: entries may carry passwords. The
		// databases record the move; running the command again writes it.
		a.errorf("shards move: partition %d is on shard %s now (both databases record the move), but writing the shard map %s failed: %v; "+
			"run the same command again to write it (nothing is moved twice); until then processors are refused partition %d on shard %s and keep retrying",
			p, targetName, mapPath, err, p, res.SourceShard)
		return exitFailed
	}
	tables := make([]string, 0, len(res.Rows))
	for t := range res.Rows {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	fmt.Fprintf(a.stdout, "partition %d moved from shard %s to shard %s: %d rows in %s, epoch %d on %s\n",
		p, res.SourceShard, targetName, res.Total, res.Took.Round(time.Millisecond), res.Epoch, targetName)
	switch res.Resumed {
	case admin.ResumedCopy:
		fmt.Fprintf(a.stdout, "  (an interrupted move completed: it had fenced partition %d on %s; copied now)\n", p, res.SourceShard)
	case admin.ResumedRecord:
		fmt.Fprintf(a.stdout, "  (an interrupted move completed: %s had the copy; %s records the move now)\n", targetName, res.SourceShard)
	case admin.ResumedDone:
		fmt.Fprintf(a.stdout, "  (an interrupted move completed: both databases had recorded it; only the map was left)\n")
	}
	for _, t := range tables {
		fmt.Fprintf(a.stdout, "  %-20s %d\n", t, res.Rows[t])
	}
	fmt.Fprintf(a.stdout, "shard map %s updated; processors claim partition %d on %s when refused on %s (or at SIGHUP)\n", mapPath, p, targetName, res.SourceShard)
	fmt.Fprintf(a.stdout, "the copy on %s is read-only; delete it with: mandatectl shards drop-moved %d --shard %s --shard-map %s\n", res.SourceShard, p, res.SourceShard, mapPath)
	return exitOK
}

// shardURL finds a shard's URL in the map; a shard the map no longer lists
// (all its partitions moved away and it was removed) is not found.
func shardURL(m *shardmap.Map, name string) (string, bool) {
	for _, s := range m.Shards {
		if s.Name == name {
			return s.URL, true
		}
	}
	return "", false
}

type shardsDropMovedOptions struct {
	mapPath, shard string
	timeout        time.Duration

	p   int32
	url string
}

func (o *shardsDropMovedOptions) register(f *flagSet) {
	shardMapFlag(f, &o.mapPath)
	f.StringVar(&o.shard, "shard", "", "the shard P moved away from (required)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on the whole drop")
}

func (o *shardsDropMovedOptions) validate(in given) error {
	var ok bool
	if o.p, ok = partitionArg(in.args); !ok {
		return errors.New("want one partition number")
	}
	if o.mapPath == "" || o.shard == "" {
		return errors.New("--shard-map and --shard are required")
	}
	m, err := shardmap.Read(o.mapPath)
	if err != nil {
		return fmt.Errorf("--shard-map: %w", err)
	}
	if o.url, ok = shardURL(m, o.shard); !ok {
		return fmt.Errorf("the shard map names no shard %q", o.shard)
	}
	return nil
}

func runShardsDropMoved(ctx context.Context, a *app, o *shardsDropMovedOptions) int {
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	deleted, err := admin.DropMoved(ctx, o.url, o.p)
	if err != nil {
		a.errorf("shards drop-moved: %v", err)
		return exitFailed
	}
	var total int64
	for _, n := range deleted {
		total += n
	}
	fmt.Fprintf(a.stdout, "partition %d: %d rows of its old copy deleted on shard %s\n", o.p, total, o.shard)
	return exitOK
}

type shardsMovesOptions struct {
	mapPath string
	timeout time.Duration

	m *shardmap.Map
}

func (o *shardsMovesOptions) register(f *flagSet) {
	shardMapFlag(f, &o.mapPath)
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the queries")
}

// validate takes positional arguments without a word, as it always did.
func (o *shardsMovesOptions) validate(given) error {
	if o.mapPath == "" {
		return errors.New("--shard-map is required")
	}
	var err error
	if o.m, err = shardmap.Read(o.mapPath); err != nil {
		return fmt.Errorf("--shard-map: %w", err)
	}
	return nil
}

func runShardsMoves(ctx context.Context, a *app, o *shardsMovesOptions) int {
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tPARTITION\tSTATE\tPEER\tEPOCH\tROWS\tUPDATED")
	failed := false
	for _, s := range o.m.Shards {
		moves, err := admin.Moves(ctx, s.URL)
		if err != nil {
			a.errorf("shards moves: shard %s: %v", s.Name, err)
			failed = true
			continue
		}
		for _, mv := range moves {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\n", s.Name, mv.Partition, mv.State, mv.Peer, mv.Epoch, mv.Rows, mv.UpdatedAt.UTC().Format(time.RFC3339))
		}
	}
	tw.Flush()
	if failed {
		return exitFailed
	}
	return exitOK
}
