package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheCLIReferenceIsCurrent: docs/cli is what the command tree
// generates. A command whose usage, text, examples or flags changed since
// 'make cli-docs' last ran is named, and so is a page of no command.
func TestTheCLIReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", filepath.FromSlash(cliDocsDir))
	var stale []string
	pages := map[string]bool{}
	for _, p := range cliDocs(newTree()) {
		pages[p.file] = true
		b, err := os.ReadFile(filepath.Join(dir, p.file))
		if err != nil {
			stale = append(stale, cliDocsDir+"/"+p.file+" is missing")
			continue
		}
		for _, c := range differingCommands(p.text, string(b)) {
			stale = append(stale, c+" differs from "+cliDocsDir+"/"+p.file)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	require.NoError(t, err)
	for _, f := range files {
		if !pages[filepath.Base(f)] {
			stale = append(stale, cliDocsDir+"/"+filepath.Base(f)+" documents no command")
		}
	}
	require.Empty(t, stale, "the CLI reference is not what the command tree generates: run make cli-docs")
}

// TestTheDocsCommandWritesTheReferenceAndRemovesStalePages runs the
// hidden command 'make cli-docs' runs.
func TestTheDocsCommandWritesTheReferenceAndRemovesStalePages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mandatectl_gone.md"), []byte("a command removed since\n"), 0o644))
	r := ctl(t, "docs", "--dir", dir)
	require.Equal(t, exitOK, r.code, "%s", r)
	pages := cliDocs(newTree())
	for _, p := range pages {
		b, err := os.ReadFile(filepath.Join(dir, p.file))
		require.NoError(t, err)
		require.Equal(t, p.text, string(b), p.file)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	require.Len(t, files, len(pages), "the stale page is removed")
	require.NotContains(t, ctl(t, "--help").stdout, "docs", "the generator is listed nowhere")
}

var commandHeading = regexp.MustCompile(`(?m)^#+ (mandatectl.*)$`)

// differingCommands names the commands whose sections differ between the
// generated page and the committed one ("mandatectl shards move").
func differingCommands(want, got string) []string {
	w, g := sections(want), sections(got)
	var out []string
	for _, h := range w.order {
		if w.text[h] != g.text[h] {
			out = append(out, h)
		}
	}
	for _, h := range g.order {
		if _, ok := w.text[h]; !ok {
			out = append(out, h+" (no such command)")
		}
	}
	if len(out) == 0 && want != got {
		out = append(out, "the page")
	}
	return out
}

type pageSections struct {
	order []string
	text  map[string]string
}

func sections(page string) pageSections {
	s := pageSections{text: map[string]string{}}
	idx := commandHeading.FindAllStringSubmatchIndex(page, -1)
	for i, m := range idx {
		end := len(page)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		h := page[m[2]:m[3]]
		s.order = append(s.order, h)
		s.text[h] = page[m[0]:end]
	}
	return s
}
