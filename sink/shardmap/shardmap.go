package shardmap

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Map maps partitions to PostgreSQL databases (docs/operating.md, "Scaling out
// PostgreSQL: the shard map"). Every shard holds the whole schema but only its partitions' rows:
// claims, fence, mandates, authorizations, idempotency keys, intents,
// outbox and relay bookkeeping. One shard is the control shard: the org
// settings (retention, replay window, grantor keys, grant signing, gateway
// tokens) live there only, every shard's partitions read them from it, and
// the other shards refuse them in SQL.
type Map struct {
	Shards []Shard `yaml:"shards"`

	path string // the file it was read from (Read), for Shards.Reload
	raw  []byte // its content
}

// Path is the file the map was read from ("" when parsed from bytes).
func (m *Map) Path() string { return m.path }

// Raw is the content of the file the map was read from (nil when parsed
// from bytes): Shards.Reload compares it with the file's content now.
func (m *Map) Raw() []byte { return m.raw }

// Shard is one database and the partitions it owns.
type Shard struct {
	// Name identifies the shard in logs, metrics, /readyz and
	// mandated_meta. Lower-case letters, digits and dashes.
	Name string `yaml:"name"`
	// Partitions is a set of partitions: ranges "first-last" (inclusive)
	// and single numbers separated by commas ("0-2,5"), or "none" (a shard
	// whose partitions all moved away).
	Partitions string `yaml:"partitions"`
	// URL is the database's connection string; URLFile, a file holding it
	// (a mounted secret), wins over it.
	URL     string `yaml:"url"`
	URLFile string `yaml:"url_file"`
	// Control marks the control shard. Defaults to the shard owning
	// partition 0.
	Control bool `yaml:"control"`

	first, last int32   // parsed from Partitions: the lowest and the highest
	set         []int32 // every partition, sorted, when they are not one range; empty (non-nil) for "none"
}

// First and Last are the shard's partition range, inclusive.
func (s Shard) First() int32 { return s.first }

// Last is the last partition the shard owns.
func (s Shard) Last() int32 { return s.last }

// Listed says whether the shard's partitions are a set ("0-2,5", "none")
// rather than one range.
func (s Shard) Listed() bool { return s.set != nil }

// None says whether the shard owns no partition: all of them moved away.
func (s Shard) None() bool { return s.set != nil && len(s.set) == 0 }

// Unbounded says whether the shard owns every partition there is or will
// be: the single shard of one database (Single).
func (s Shard) Unbounded() bool { return s.last == maxPartition }

// RangeShard is a shard owning the partitions first to last, inclusive.
func RangeShard(first, last int32) Shard { return Shard{first: first, last: last} }

// All is every partition of n: 0 to n-1.
func All(n int32) []int32 {
	out := make([]int32, n)
	for p := range n {
		out[p] = p
	}
	return out
}

// Owns says whether the shard owns partition p.
func (s Shard) Owns(p int32) bool {
	if s.set != nil {
		_, found := slices.BinarySearch(s.set, p)
		return found
	}
	return p >= s.first && p <= s.last
}

// Set returns the shard's partitions below n, in order.
func (s Shard) Set(n int32) []int32 {
	if s.set != nil {
		return slices.Clone(s.set)
	}
	out := make([]int32, 0, max(0, min(s.last, n-1)-s.first+1))
	for p := s.first; p <= s.last && p < n; p++ {
		out = append(out, p)
	}
	return out
}

// Range is the shard's partitions as written in a map ("6-11", "0-2,5"),
// "none", or "all" for the single shard of one --database-url.
func (s Shard) Range() string {
	if s.last == maxPartition {
		return "all"
	}
	if s.set != nil {
		return FormatPartitions(s.set)
	}
	return FormatPartitions(s.Set(s.last + 1))
}

// FormatPartitions writes a set of partitions as a map does: "0-2,5", or
// "none".
func FormatPartitions(set []int32) string {
	set = slices.Clone(set)
	slices.Sort(set)
	set = slices.Compact(set)
	if len(set) == 0 {
		return "none"
	}
	var b strings.Builder
	for i := 0; i < len(set); {
		j := i
		for j+1 < len(set) && set[j+1] == set[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if i == j {
			fmt.Fprintf(&b, "%d", set[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", set[i], set[j])
		}
		i = j + 1
	}
	return b.String()
}

// SingleShard is the map of one database owning every partition: today's
// behaviour with --database-url.
const SingleShard = "main"

var shardName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Read reads and checks a shard map file (YAML), reading every
// url_file it names.
func Read(path string) (*Map, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sink: read the shard map: %w", err)
	}
	m, err := Parse(b)
	if err != nil {
		return nil, err
	}
	m.path, m.raw = path, b
	return m, nil
}

// Parse parses a shard map (YAML), reads every url_file it names
// and checks it (Validate).
func Parse(b []byte) (*Map, error) {
	var m Map
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("sink: parse the shard map: %w", err)
	}
	for i := range m.Shards {
		s := &m.Shards[i]
		if s.URLFile != "" {
			u, err := os.ReadFile(s.URLFile)
			if err != nil {
				return nil, fmt.Errorf("sink: shard %q: url_file: %w", s.Name, err)
			}
			s.URL = strings.TrimRight(string(u), "\r\n")
		}
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Single returns the map of one database owning every partition.
func Single(url string) *Map {
	return &Map{Shards: []Shard{{Name: SingleShard, URL: url, Control: true, first: 0, last: maxPartition}}}
}

// maxPartition stands for "every partition" in a single-database map.
const maxPartition = 1<<31 - 1

// Validate checks names, URLs and ranges: ranges that do not overlap and
// leave no gap from partition 0; exactly one control shard. Whether the
// last range ends at the topics' partition count is checked at start
// (Cover).
func (m *Map) Validate() error {
	if len(m.Shards) == 0 {
		return errors.New("sink: the shard map names no shard")
	}
	names := map[string]bool{}
	controls := 0
	for i := range m.Shards {
		s := &m.Shards[i]
		if !shardName.MatchString(s.Name) {
			return fmt.Errorf("sink: shard name %q: use lower-case letters, digits and dashes", s.Name)
		}
		if names[s.Name] {
			return fmt.Errorf("sink: shard %q is named twice", s.Name)
		}
		names[s.Name] = true
		if s.URL == "" {
			return fmt.Errorf("sink: shard %q has no url or url_file", s.Name)
		}
		if s.first == 0 && s.last == 0 && s.set == nil || s.Partitions != "" {
			set, err := parsePartitions(s.Partitions)
			if err != nil {
				return fmt.Errorf("sink: shard %q: partitions %q: %w", s.Name, s.Partitions, err)
			}
			s.setPartitions(set)
		}
		if s.Control {
			controls++
		}
	}
	if controls > 1 {
		return errors.New("sink: more than one shard is marked control")
	}
	sort.SliceStable(m.Shards, func(i, j int) bool { return m.Shards[i].first < m.Shards[j].first })
	if len(m.Shards) == 1 && m.Shards[0].last == maxPartition {
		m.Shards[0].Control = true
		return nil
	}
	// Every partition from 0 to the highest named is owned exactly once.
	owner := map[int32]string{}
	var top int32 = -1
	for _, s := range m.Shards {
		for _, p := range s.Set(maxPartition) {
			if o, dup := owner[p]; dup {
				return fmt.Errorf("sink: partition %d is owned by shards %q and %q", p, o, s.Name)
			}
			owner[p] = s.Name
			top = max(top, p)
		}
	}
	for p := int32(0); p <= top; p++ {
		if _, ok := owner[p]; !ok {
			q := p
			for q+1 <= top && owner[q+1] == "" {
				q++
			}
			return fmt.Errorf("sink: no shard owns partitions %d-%d", p, q)
		}
	}
	if controls == 0 {
		m.Shards[m.For(0)].Control = true
	}
	return nil
}

// setPartitions records a parsed set: one range as first/last, anything
// else as a set.
func (s *Shard) setPartitions(set []int32) {
	switch {
	case len(set) == 0:
		s.first, s.last, s.set = maxPartition, -1, []int32{}
	case int(set[len(set)-1]-set[0]) == len(set)-1:
		s.first, s.last, s.set = set[0], set[len(set)-1], nil
	default:
		s.first, s.last, s.set = set[0], set[len(set)-1], set
	}
	s.Partitions = FormatPartitions(set)
}

// parsePartitions parses "0-2,5" (or "none") into a sorted set.
func parsePartitions(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "none" {
		return []int32{}, nil
	}
	var set []int32
	for _, part := range strings.Split(s, ",") {
		first, last, err := parseRange(part)
		if err != nil {
			return nil, err
		}
		if last-first > 1<<16 {
			return nil, errors.New("range too large")
		}
		for p := first; p <= last; p++ {
			set = append(set, p)
		}
	}
	slices.Sort(set)
	if len(slices.Compact(slices.Clone(set))) != len(set) {
		return nil, errors.New("a partition is named twice")
	}
	return set, nil
}

func parseRange(s string) (int32, int32, error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	first, err := strconv.ParseInt(strings.TrimSpace(a), 10, 32)
	if err != nil || first < 0 {
		return 0, 0, errors.New(`want "first-last" or one partition number`)
	}
	last := first
	if isRange {
		if last, err = strconv.ParseInt(strings.TrimSpace(b), 10, 32); err != nil || last < first {
			return 0, 0, errors.New(`want "first-last" with first <= last`)
		}
	}
	return int32(first), int32(last), nil
}

// Cover checks that the shards own exactly partitions 0 to n-1.
func (m *Map) Cover(n int32) error {
	var top int32 = -1
	for _, s := range m.Shards {
		if s.last == maxPartition {
			return nil
		}
		if len(s.set) > 0 || s.set == nil {
			top = max(top, s.last)
		}
	}
	if top != n-1 {
		return fmt.Errorf("sink: the shard map ends at partition %d but the topics have %d partitions (0-%d)", top, n, n-1)
	}
	return nil
}

// For returns the index of the shard owning partition p, or -1.
func (m *Map) For(p int32) int {
	for i, s := range m.Shards {
		if s.Owns(p) {
			return i
		}
	}
	return -1
}

// Control returns the index of the control shard.
func (m *Map) Control() int {
	for i, s := range m.Shards {
		if s.Control {
			return i
		}
	}
	return 0
}
