package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/mandated/mandated/cmd/internal/cli"
)

// The CLI reference (docs/cli) is generated from the command tree, as
// temporal's CLI generates its docs: an index, mandatectl.md, and a page
// per top-level command with its subcommands, each with its usage,
// description, examples and flags (defaults, environment variables).
// 'make cli-docs' runs the hidden 'mandatectl docs'; TestTheCLIReferenceIsCurrent
// fails, naming the command, when the committed pages differ.

// cliDocsDir is where the reference lives, from the repository's root.
const cliDocsDir = "docs/cli"

const generatedNote = "<!-- Generated from mandatectl's command tree (cmd/mandatectl) by 'make cli-docs'. Do not edit. -->\n\n"

func docsCommand() *command {
	return leaf(&command{
		name:    "docs",
		hidden:  true,
		summary: "write the CLI reference from the command tree",
		usage:   "[--dir DIR]",
		description: `Write mandatectl's CLI reference from its command tree: DIR/mandatectl.md
(the index) and DIR/mandatectl_<command>.md for every top-level command.
Pages of commands that no longer exist are removed. 'make cli-docs' runs it.`,
		examples: []string{"go run ./cmd/mandatectl docs --dir docs/cli"},
	}, runDocs)
}

type docsOptions struct{ dir string }

func (o *docsOptions) register(f *flagSet) {
	f.StringVar(&o.dir, "dir", cliDocsDir, "the directory to write the pages to")
}

func (o *docsOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.dir == "" {
		return errors.New("--dir is required")
	}
	return nil
}

func runDocs(_ context.Context, a *app, o *docsOptions) int {
	pages := cliDocs(newTree())
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		a.errorf("docs: %v", err)
		return exitFailed
	}
	keep := map[string]bool{}
	for _, p := range pages {
		keep[p.file] = true
		if err := os.WriteFile(filepath.Join(o.dir, p.file), []byte(p.text), 0o644); err != nil {
			a.errorf("docs: %v", err)
			return exitFailed
		}
	}
	old, err := filepath.Glob(filepath.Join(o.dir, "mandatectl*.md"))
	if err != nil {
		a.errorf("docs: %v", err)
		return exitFailed
	}
	for _, f := range old {
		if !keep[filepath.Base(f)] {
			if err := os.Remove(f); err != nil {
				a.errorf("docs: %v", err)
				return exitFailed
			}
		}
	}
	fmt.Fprintf(a.stdout, "wrote %s to %s\n", plural(len(pages), "page", "pages"), o.dir)
	return exitOK
}

// docPage is one page of the reference.
type docPage struct {
	command string // the top-level command it documents ("" for the index)
	file    string
	text    string
}

// pageFile is the page of top-level command c.
func pageFile(c *command) string {
	if c.parent == nil {
		return "mandatectl.md"
	}
	return "mandatectl_" + c.name + ".md"
}

// cliDocs renders the reference of root's tree.
func cliDocs(root *command) []docPage {
	pages := []docPage{{file: pageFile(root), text: indexPage(root)}}
	for _, c := range root.visible() {
		var b strings.Builder
		b.WriteString(generatedNote)
		writeCommand(&b, c, "#")
		pages = append(pages, docPage{command: c.name, file: pageFile(c), text: b.String()})
	}
	return pages
}

func indexPage(root *command) string {
	var b strings.Builder
	b.WriteString(generatedNote)
	fmt.Fprintf(&b, "# mandatectl\n\n```text\nmandatectl %s\n```\n\n", root.usage)
	fmt.Fprintf(&b, "```text\n%s\n```\n", strings.TrimSpace(root.description))
	for _, g := range groups {
		fmt.Fprintf(&b, "\n## %s\n\n| command | |\n|---|---|\n", g)
		for _, c := range root.inGroup(g) {
			fmt.Fprintf(&b, "| [`%s`](%s) | %s |\n", c.name, pageFile(c), cell(c.summary))
		}
	}
	fmt.Fprintf(&b, "\n## Exit codes\n\n```text\n%s\n```\n", strings.TrimSpace(topLevelFooter[strings.Index(topLevelFooter, "Exit codes"):]))
	return b.String()
}

// writeCommand writes c and, below it, its subcommands, under a heading
// of level h.
func writeCommand(b *strings.Builder, c *command, h string) {
	fmt.Fprintf(b, "%s mandatectl %s\n\n", h, c.path())
	if c.summary != "" {
		fmt.Fprintf(b, "%s.\n\n", upperFirst(c.summary))
	}
	fmt.Fprintf(b, "```text\nmandatectl %s %s\n```\n\n", c.path(), c.usage)
	fmt.Fprintf(b, "```text\n%s\n```\n", strings.Trim(c.description, "\n"))
	if c.opts == nil {
		subs := c.visible()
		fmt.Fprintf(b, "\n| subcommand | |\n|---|---|\n")
		for _, s := range subs {
			fmt.Fprintf(b, "| [`%s`](#%s) | %s |\n", s.name, anchor("mandatectl "+s.path()), cell(s.summary))
		}
		for _, s := range subs {
			b.WriteString("\n")
			writeCommand(b, s, h+"#")
		}
		return
	}
	if len(c.examples) > 0 {
		fmt.Fprintf(b, "\nExamples:\n\n```sh\n%s\n```\n", strings.Join(c.examples, "\n"))
	}
	f := c.flagSet(&app{ctx: context.Background(), stdout: io.Discard, stderr: io.Discard})
	c.opts().register(f)
	var own, conn []string
	f.VisitAll(func(fl *flag.Flag) {
		name, usage := flag.UnquoteUsage(fl)
		flagName := "`-" + fl.Name
		if len(fl.Name) > 1 {
			flagName = "`--" + fl.Name
		}
		if name != "" {
			flagName += " " + name
		}
		flagName += "`"
		def := fl.DefValue
		if d, ok := f.docDefaults[fl.Name]; ok {
			def = d
		}
		switch def {
		case "", "0", "0s", "false":
			def = ""
		default:
			def = "`" + def + "`"
		}
		if f.envFlags[fl.Name] {
			conn = append(conn, fmt.Sprintf("| %s | `%s` | %s | %s |", flagName, cli.EnvName(fl.Name), def, cell(usage)))
		} else {
			own = append(own, fmt.Sprintf("| %s | %s | %s |", flagName, def, cell(usage)))
		}
	})
	if len(own) > 0 {
		fmt.Fprintf(b, "\nFlags:\n\n| flag | default | |\n|---|---|---|\n%s\n", strings.Join(own, "\n"))
	}
	if len(conn) > 0 {
		fmt.Fprintf(b, "\nConnection flags (the daemon's; each also read from its environment variable):\n\n"+
			"| flag | environment | default | |\n|---|---|---|---|\n%s\n", strings.Join(conn, "\n"))
	}
}

// cell makes text safe in a Markdown table cell: a pipe would end the
// cell and <org> would be taken for HTML.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}

// anchor is the anchor GitHub gives a heading: lower case, punctuation
// dropped, spaces as dashes.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
