package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is one node of mandatectl's command tree. A node with
// subcommands dispatches to them by name; a leaf parses its flags into a
// new options value, validates it, and runs it (river's CLI shape: options
// validated apart from run(ctx, opts)). The help, the usage errors and the
// CLI reference in docs/cli are all read from the tree (docs.go).
type command struct {
	name        string // the word that selects it under its parent: "grant", "move"
	usage       string // what follows "mandatectl <path>" on its usage line
	summary     string // its line in its parent's list (the top-level help, docs/cli)
	group       string // a top-level command: the heading it is listed under
	description string // a group's is its help as printed; a leaf's is trimmed
	examples    []string
	hidden      bool // selectable, but listed nowhere (the docs generator)

	subcommands []*command
	parent      *command

	// A leaf: opts makes a new options value for one invocation; run runs
	// it once validate accepted it.
	opts func() options
	run  func(ctx context.Context, a *app, o options) int
}

// options is a leaf command's flags and arguments.
type options interface {
	// register declares the command's flags on f, bound to the options.
	register(f *flagSet)
	// validate checks what the command line gave before anything is
	// contacted, and derives what run needs from it; an error is a usage
	// error (exit 2).
	validate(in given) error
}

// given is what a command line holds besides its flags' values.
type given struct {
	args []string        // the positional arguments
	set  map[string]bool // the flags given on the command line (not those read from the environment)
}

// noArgs refuses positional arguments.
func (in given) noArgs() error {
	if len(in.args) > 0 {
		return fmt.Errorf("unexpected argument %q", in.args[0])
	}
	return nil
}

// leaf makes c a leaf whose options are a new T each time, run by run.
func leaf[T any, O interface {
	*T
	options
}](c *command, run func(context.Context, *app, O) int) *command {
	return leafWith(c, func() O { return O(new(T)) }, run)
}

// leafWith makes c a leaf whose options newOpts makes, run by run.
func leafWith[O options](c *command, newOpts func() O, run func(context.Context, *app, O) int) *command {
	c.opts = func() options { return newOpts() }
	c.run = func(ctx context.Context, a *app, o options) int { return run(ctx, a, o.(O)) }
	return c
}

// group makes c a node that dispatches to subs.
func group(c *command, subs ...*command) *command {
	c.subcommands = subs
	return c
}

// link sets every node's parent below c.
func (c *command) link() *command {
	for _, s := range c.subcommands {
		s.parent = c
		s.link()
	}
	return c
}

// path is the command's words after "mandatectl": "shards move" ("" for
// the root).
func (c *command) path() string {
	if c.parent == nil {
		return ""
	}
	if p := c.parent.path(); p != "" {
		return p + " " + c.name
	}
	return c.name
}

// sub returns the subcommand called name, nil if there is none.
func (c *command) sub(name string) *command {
	for _, s := range c.subcommands {
		if s.name == name {
			return s
		}
	}
	return nil
}

// visible returns the subcommands that are listed.
func (c *command) visible() []*command {
	return slices.DeleteFunc(slices.Clone(c.subcommands), func(s *command) bool { return s.hidden })
}

// execute runs c with args, the words after its path.
//
// Every node dispatches alike, the top level included: no subcommand
// prints its help on stderr and exits 2; "help", -h, -help or --help
// print it on stdout and exit 0 ("help X" is "X --help"); an unknown
// subcommand is named, then the help follows on stderr, exit 2.
func (c *command) execute(a *app, args []string) int {
	if c.opts != nil {
		return c.runLeaf(a, args)
	}
	if len(args) == 0 {
		c.printHelp(a.stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 {
			return c.execute(a, append(slices.Clip(rest), "--help"))
		}
		c.printHelp(a.stdout)
		return exitOK
	}
	if s := c.sub(name); s != nil {
		return s.execute(a, rest)
	}
	if c.parent == nil {
		fmt.Fprintf(a.stderr, "mandatectl: unknown command %q\n\n", name)
	} else {
		names := make([]string, 0, len(c.subcommands))
		for _, s := range c.visible() {
			names = append(names, s.name)
		}
		a.errorf("%s: unknown subcommand %q (%s)", c.path(), name, strings.Join(names, ", "))
		fmt.Fprintln(a.stderr)
	}
	c.printHelp(a.stderr)
	return exitUsage
}

// runLeaf parses args into a new options value, validates it and runs it.
func (c *command) runLeaf(a *app, args []string) int {
	a.path = c.path()
	o := c.opts()
	f := c.flagSet(a)
	o.register(f)
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if err := o.validate(given{args: pos, set: f.given()}); err != nil {
		return a.usageErr("%v", err)
	}
	return c.run(a.ctx, a, o)
}

// flagSet is a leaf's flag set, its help text read from c.
func (c *command) flagSet(a *app) *flagSet {
	return a.newFlagSet(c.path(), c.usage, c.description, c.examples...)
}

// printHelp prints a node's help: the top-level list of commands, or a
// group's usage line and text. (A leaf's help is its flag set's.)
func (c *command) printHelp(w io.Writer) {
	if c.parent == nil {
		c.printTopLevel(w)
		return
	}
	fmt.Fprintf(w, "usage: mandatectl %s %s\n\n%s\n", c.path(), c.usage, strings.Trim(c.description, "\n"))
}

// Command groups, in the order the top-level help lists them.
const (
	groupSetup    = "Setup"
	groupCommands = "Commands (produce, then wait for the decision)"
	groupOps      = "Operations"
)

var groups = []string{groupSetup, groupCommands, groupOps}

const topLevelFooter = `
Run 'mandatectl <command> --help' for a command's flags and examples.

Exit codes: 0 success or a positive decision; 1 a negative decision (denied,
refused, conflict, stale_version, in_doubt, expired) or a failure; 2 a usage
error or a rejected command; 3 no decision within --timeout.
`

func (c *command) printTopLevel(w io.Writer) {
	fmt.Fprintf(w, "usage: mandatectl %s\n\n%s\n", c.usage, strings.TrimSpace(c.description))
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g)
		for _, s := range c.inGroup(g) {
			fmt.Fprintf(w, "  %-15s %s\n", s.name, s.summary)
		}
	}
	fmt.Fprint(w, topLevelFooter)
}

// inGroup returns the listed top-level commands of group g by name.
func (c *command) inGroup(g string) []*command {
	var in []*command
	for _, s := range c.visible() {
		if s.group == g {
			in = append(in, s)
		}
	}
	slices.SortFunc(in, func(x, y *command) int { return strings.Compare(x.name, y.name) })
	return in
}

// commands returns the listed top-level commands by name.
func commands() map[string]*command {
	out := map[string]*command{}
	for _, s := range newTree().visible() {
		out[s.name] = s
	}
	return out
}
