// Package docs checks the documentation a newcomer reads: every relative
// link of README.md, docs/ and the bench's run notes names a file that
// exists, and every #anchor a heading of the file it points into; the pages
// a reader starts from stay short, and the index lists every page.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

const repo = "../.."

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// anchors are the heading anchors GitHub makes for a Markdown file: lower
// case, punctuation dropped, spaces as dashes, repeats numbered.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence {
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(m[1])) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestEveryLinkOfTheREADMEAndDocsResolves: the README starts small and
// links into docs/; a section moved or renamed must not leave a link behind.
func TestEveryLinkOfTheREADMEAndDocsResolves(t *testing.T) {
	t.Parallel()
	var files []string
	for _, pattern := range []string{"docs/*.md", "docs/notes/*.md", "test/bench/results/*/NOTES.md"} {
		matched, err := filepath.Glob(filepath.Join(repo, pattern))
		require.NoError(t, err)
		files = append(files, matched...)
	}
	files = append(files, filepath.Join(repo, "README.md"), filepath.Join(repo, "deploy", "README.md"),
		filepath.Join(repo, "clients", "python", "README.md"), filepath.Join(repo, "test", "infra", "README.md"),
		filepath.Join(repo, "examples", "langgraph-approval", "README.md"), filepath.Join(repo, "CHANGELOG.md"))
	var broken []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		doc := string(b)
		for _, m := range linkRE.FindAllStringSubmatch(stripCode(doc), -1) {
			url := m[1]
			if regexp.MustCompile(`^(https?:|mailto:)`).MatchString(url) {
				continue
			}
			path, anchor, _ := strings.Cut(url, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(target); err != nil {
					broken = append(broken, rel(f)+": "+url+" (no such file)")
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			tb, err := os.ReadFile(target)
			require.NoError(t, err)
			if !anchors(string(tb))[anchor] {
				broken = append(broken, rel(f)+": "+url+" (no such heading)")
			}
		}
	}
	require.Empty(t, broken, "links that lead nowhere")
}

// TestTheREADMEAndTheReferencePagesStaySmall: the pages a reader starts
// from stay short; what grows (evidence, dated investigations) lives beside
// them and is linked.
func TestTheREADMEAndTheReferencePagesStaySmall(t *testing.T) {
	t.Parallel()
	for _, page := range []struct {
		path     string
		maxLines int
		why      string
	}{
		{"README.md", 320, "the README is the short version: what it is, the two commands, make dev, the callers' snippets, the guarantees, links (the rest lives in docs/)"},
		{"docs/README.md", 80, "the index is a line per page"},
		{"docs/performance.md", 200, "performance.md is the reference: the capacity model, the settings, running and reading the bench, the history; each investigation lives beside its run (test/bench/results/<run>/NOTES.md) or in docs/notes/"},
	} {
		b, err := os.ReadFile(filepath.Join(repo, page.path))
		require.NoError(t, err)
		require.LessOrEqual(t, strings.Count(string(b), "\n"), page.maxLines, page.path+": "+page.why)
	}
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	require.NoError(t, err)
	require.True(t, strings.Contains(string(b), "make demo") && strings.Contains(string(b), "make test"), "the README's first commands")
}

// TestTheDocsIndexListsEveryPage: docs/README.md names every page under
// docs/, so a page added there is found from the index.
func TestTheDocsIndexListsEveryPage(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repo, "docs", "README.md"))
	require.NoError(t, err)
	linked := map[string]bool{}
	for _, m := range linkRE.FindAllStringSubmatch(stripCode(string(b)), -1) {
		path, _, _ := strings.Cut(m[1], "#")
		linked[filepath.Clean(path)] = true
	}
	var missing []string
	for _, pattern := range []string{"*.md", "notes/*.md"} {
		pages, err := filepath.Glob(filepath.Join(repo, "docs", pattern))
		require.NoError(t, err)
		for _, p := range pages {
			r, err := filepath.Rel(filepath.Join(repo, "docs"), p)
			require.NoError(t, err)
			if r != "README.md" && !linked[r] {
				missing = append(missing, r)
			}
		}
	}
	require.Empty(t, missing, "pages under docs/ that docs/README.md does not list")
}

// TestTheChangelogIsGroupedByReleaseWithEntriesOfOneToThreeLines: the
// CHANGELOG says what a user or operator sees, release by release (Unreleased
// on top, then the versions newest first), in Keep a Changelog's sections, one
// of each per release; an entry is one "- " bullet and at most two continuation
// lines of about 100 characters. Evidence and figures live in docs/. A few
// words under a release heading, before its first section, may say what it was.
func TestTheChangelogIsGroupedByReleaseWithEntriesOfOneToThreeLines(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repo, "CHANGELOG.md"))
	require.NoError(t, err)
	const maxLines, maxWidth = 3, 110
	releaseRE := regexp.MustCompile(`^## \[(\d+)\.(\d+)\.(\d+)\] - \d{4}-\d{2}-\d{2}$`)
	sections := map[string]bool{"Added": true, "Changed": true, "Deprecated": true, "Removed": true, "Fixed": true, "Security": true}
	var problems []string
	release, section, seen := "", "", map[string]bool{}
	var releases []string
	entry, entryLine, entryLines := "", 0, 0
	endEntry := func() {
		if entry != "" && entryLines > maxLines {
			problems = append(problems, "line "+strconv.Itoa(entryLine)+": an entry of "+strconv.Itoa(entryLines)+" lines (at most "+strconv.Itoa(maxLines)+"): "+entry)
		}
		entry, entryLines = "", 0
	}
	for i, line := range strings.Split(string(b), "\n") {
		n := i + 1
		if w := len([]rune(line)); w > maxWidth {
			problems = append(problems, "line "+strconv.Itoa(n)+": "+strconv.Itoa(w)+" characters (at most "+strconv.Itoa(maxWidth)+")")
		}
		switch {
		case strings.HasPrefix(line, "## "):
			endEntry()
			if line != "## Unreleased" && !releaseRE.MatchString(line) {
				problems = append(problems, "line "+strconv.Itoa(n)+": a release heading is \"## Unreleased\" or \"## [X.Y.Z] - YYYY-MM-DD\": "+line)
			}
			release, section, seen = line, "", map[string]bool{}
			releases = append(releases, line)
		case strings.HasPrefix(line, "### "):
			endEntry()
			name := strings.TrimPrefix(line, "### ")
			if !sections[name] {
				problems = append(problems, "line "+strconv.Itoa(n)+": not a Keep a Changelog section: "+line)
			}
			if seen[name] {
				problems = append(problems, "line "+strconv.Itoa(n)+": a second \""+line+"\" in "+release)
			}
			seen[name], section = true, line
		case strings.HasPrefix(line, "- "):
			endEntry()
			entry, entryLine, entryLines = line, n, 1
		case strings.TrimSpace(line) == "" || strings.HasPrefix(line, "# "):
			endEntry()
		case entry != "":
			entryLines++
		case section != "": // a release's opening words may be prose; a section holds only entries
			problems = append(problems, "line "+strconv.Itoa(n)+": text outside an entry: "+line)
		}
	}
	endEntry()
	require.NotEmpty(t, releases, "the CHANGELOG has releases")
	require.Equal(t, "## Unreleased", releases[0], "Unreleased comes first")
	for i := 2; i < len(releases); i++ {
		prev, cur := releaseRE.FindStringSubmatch(releases[i-1]), releaseRE.FindStringSubmatch(releases[i])
		if prev != nil && cur != nil && version(t, cur) >= version(t, prev) {
			problems = append(problems, "releases out of order (newest first): "+releases[i-1]+" before "+releases[i])
		}
	}
	require.Empty(t, strings.Join(problems, "\n"), "the CHANGELOG's shape")
}

func version(t *testing.T, m []string) int {
	v := 0
	for _, s := range m[1:4] {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		v = v*1000 + n
	}
	return v
}

// stripCode blanks fenced code blocks (a link inside one is code).
func stripCode(doc string) string {
	var b strings.Builder
	fence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func rel(f string) string {
	r, _ := filepath.Rel(repo, f)
	return r
}
