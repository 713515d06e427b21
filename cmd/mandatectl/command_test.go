package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEveryGroupDispatchesAlike: the top level and every command with
// subcommands answer the same way — no subcommand is a usage error with
// the help on stderr, help is on stdout, an unknown subcommand is named.
func TestEveryGroupDispatchesAlike(t *testing.T) {
	t.Parallel()
	var groups []*command
	var walk func(c *command)
	walk = func(c *command) {
		if c.opts == nil {
			groups = append(groups, c)
		}
		for _, s := range c.subcommands {
			walk(s)
		}
	}
	walk(newTree())
	require.Len(t, groups, 8, "the top level and seven groups")
	for _, g := range groups {
		path := strings.Fields(g.path())
		r := ctl(t, path...)
		require.Equal(t, exitUsage, r.code, "%q: %s", path, r)
		require.Contains(t, r.stderr, "usage: mandatectl ", path)
		help := r.stderr
		for _, h := range []string{"--help", "-h", "help"} {
			r = ctl(t, append(path, h)...)
			require.Equal(t, exitOK, r.code, "%q %s: %s", path, h, r)
			require.Equal(t, help, r.stdout, "%q %s", path, h)
			require.Empty(t, r.stderr)
		}
		r = ctl(t, append(path, "frobnicate")...)
		require.Equal(t, exitUsage, r.code, "%q: %s", path, r)
		require.Contains(t, r.stderr, `"frobnicate"`, path)
		require.True(t, strings.HasSuffix(r.stderr, help), "%q: the help follows", path)
	}
}

// TestEveryLeafHasASummary: the reference lists every command with its
// summary, usage line and description.
func TestEveryLeafHasASummary(t *testing.T) {
	t.Parallel()
	var walk func(c *command)
	walk = func(c *command) {
		if c.parent != nil && !c.hidden {
			require.NotEmpty(t, c.summary, c.path())
			require.NotEmpty(t, c.usage, c.path())
			require.NotEmpty(t, c.description, c.path())
		}
		for _, s := range c.subcommands {
			walk(s)
		}
	}
	walk(newTree())
}

// TestHelpOfASubcommandIsItsHelpFlag: 'help X Y' is 'X Y --help'.
func TestHelpOfASubcommandIsItsHelpFlag(t *testing.T) {
	t.Parallel()
	want := ctl(t, "shards", "move", "--help")
	require.Equal(t, exitOK, want.code)
	require.Equal(t, want, ctl(t, "help", "shards", "move"))
	require.Equal(t, want, ctl(t, "shards", "help", "move"))
}
