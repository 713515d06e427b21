package sink

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ShardMap maps partitions to PostgreSQL databases (README, "Scaling out
// PostgreSQL: the shard map"). Every shard holds the whole schema but only its partitions' rows:
// claims, fence, mandates, authorizations, idempotency keys, intents,
// outbox and relay bookkeeping. One shard is the control shard: the org
// settings (retention, replay window, grantor keys, grant signing, gateway
// tokens) live there only, every shard's partitions read them from it, and
// the other shards refuse them in SQL.
type ShardMap struct {
	Shards []Shard `yaml:"shards"`
}

// Shard is one database and the partitions it owns.
type Shard struct {
	// Name identifies the shard in logs, metrics, /readyz and
	// mandated_meta. Lower-case letters, digits and dashes.
	Name string `yaml:"name"`
	// Partitions is "first-last" (inclusive) or one number.
	Partitions string `yaml:"partitions"`
	// URL is the database's connection string; URLFile, a file holding it
	// (a mounted secret), wins over it.
	URL     string `yaml:"url"`
	URLFile string `yaml:"url_file"`
	// Control marks the control shard. Defaults to the shard owning
	// partition 0.
	Control bool `yaml:"control"`

	first, last int32 // parsed from Partitions
}

// First and Last are the shard's partition range, inclusive.
func (s Shard) First() int32 { return s.first }

// Last is the last partition the shard owns.
func (s Shard) Last() int32 { return s.last }

// Owns says whether the shard owns partition p.
func (s Shard) Owns(p int32) bool { return p >= s.first && p <= s.last }

// Range is the shard's partitions as written in a map ("6-11"), or "all"
// for the single shard of one --database-url.
func (s Shard) Range() string {
	if s.last == maxPartition {
		return "all"
	}
	return fmt.Sprintf("%d-%d", s.first, s.last)
}

// SingleShard is the map of one database owning every partition: today's
// behaviour with --database-url.
const SingleShard = "main"

var shardName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ReadShardMap reads and checks a shard map file (YAML), reading every
// url_file it names.
func ReadShardMap(path string) (*ShardMap, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sink: read the shard map: %w", err)
	}
	return ParseShardMap(b)
}

// ParseShardMap parses a shard map (YAML), reads every url_file it names
// and checks it (Validate).
func ParseShardMap(b []byte) (*ShardMap, error) {
	var m ShardMap
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
func Single(url string) *ShardMap {
	return &ShardMap{Shards: []Shard{{Name: SingleShard, URL: url, Control: true, first: 0, last: maxPartition}}}
}

// maxPartition stands for "every partition" in a single-database map.
const maxPartition = 1<<31 - 1

// Validate checks names, URLs and ranges: ranges that do not overlap and
// leave no gap from partition 0; exactly one control shard. Whether the
// last range ends at the topics' partition count is checked at start
// (Cover).
func (m *ShardMap) Validate() error {
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
		if s.first == 0 && s.last == 0 || s.Partitions != "" {
			first, last, err := parseRange(s.Partitions)
			if err != nil {
				return fmt.Errorf("sink: shard %q: partitions %q: %w", s.Name, s.Partitions, err)
			}
			s.first, s.last = first, last
		}
		if s.Control {
			controls++
		}
	}
	if controls > 1 {
		return errors.New("sink: more than one shard is marked control")
	}
	sort.SliceStable(m.Shards, func(i, j int) bool { return m.Shards[i].first < m.Shards[j].first })
	next := int32(0)
	for _, s := range m.Shards {
		if s.first != next {
			if s.first < next {
				return fmt.Errorf("sink: shard %q (partitions %s) overlaps the shard before it", s.Name, s.Range())
			}
			return fmt.Errorf("sink: no shard owns partitions %d-%d", next, s.first-1)
		}
		next = s.last + 1
	}
	if controls == 0 {
		m.Shards[0].Control = true
	}
	return nil
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
func (m *ShardMap) Cover(n int32) error {
	last := m.Shards[len(m.Shards)-1]
	if last.last == maxPartition {
		return nil
	}
	if last.last != n-1 {
		return fmt.Errorf("sink: the shard map ends at partition %d but the topics have %d partitions (0-%d)", last.last, n, n-1)
	}
	return nil
}

// For returns the index of the shard owning partition p, or -1.
func (m *ShardMap) For(p int32) int {
	for i, s := range m.Shards {
		if s.Owns(p) {
			return i
		}
	}
	return -1
}

// Control returns the index of the control shard.
func (m *ShardMap) Control() int {
	for i, s := range m.Shards {
		if s.Control {
			return i
		}
	}
	return 0
}
