// Package docs checks the documentation a newcomer reads: every relative
// link of README.md and docs/ names a file that exists, and every #anchor a
// heading of the file it points into.
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
	files, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	require.NoError(t, err)
	files = append(files, filepath.Join(repo, "README.md"), filepath.Join(repo, "deploy", "README.md"),
		filepath.Join(repo, "clients", "python", "README.md"), filepath.Join(repo, "test", "infra", "README.md"),
		filepath.Join(repo, "examples", "langgraph-approval", "README.md"))
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

func TestTheREADMEStartsSmall(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	require.NoError(t, err)
	lines := strings.Count(string(b), "\n")
	require.LessOrEqual(t, lines, 320, "the README is the short version: what it is, the two commands, make dev, the callers' snippets, the guarantees, links (the rest lives in docs/)")
	require.True(t, strings.Contains(string(b), "make demo") && strings.Contains(string(b), "make test"), "the README's first commands")
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
