package shardmap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"

	"github.com/mandated/mandated/internal/failpoint"
)

// MoveIn returns the shard map file's content b with partition p
// given to shard to: p leaves the set of the shard that lists it and joins
// to's. A shard the map does not name yet is added with url (a new shard;
// url_file is better for a secret, edit it in afterwards). Comments and the
// other fields are kept; the control shard is marked explicitly, so moving
// partition 0 does not change which shard holds the org settings.
func MoveIn(b []byte, p int32, to, url string) ([]byte, error) {
	doc, list, control, err := editShardMap(b)
	if err != nil {
		return nil, err
	}
	found := false
	for _, entry := range list.Content {
		name := field(entry, "name")
		if name == nil {
			continue
		}
		parts := field(entry, "partitions")
		if parts == nil {
			return nil, fmt.Errorf("sink: shard %q has no partitions", name.Value)
		}
		set, err := parsePartitions(parts.Value)
		if err != nil {
			return nil, fmt.Errorf("sink: shard %q: partitions %q: %w", name.Value, parts.Value, err)
		}
		set = slices.DeleteFunc(set, func(q int32) bool { return q == p })
		if name.Value == to {
			set = append(set, p)
			found = true
		}
		setScalar(parts, FormatPartitions(set))
		if name.Value == control {
			markControl(entry)
		}
	}
	if !found {
		if url == "" {
			return nil, fmt.Errorf("sink: the shard map names no shard %q: give its url", to)
		}
		entry := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		entry.Content = append(entry.Content, scalar("name"), scalar(to), scalar("partitions"), nil, scalar("url"), scalar(url))
		entry.Content[3] = &yaml.Node{Kind: yaml.ScalarNode}
		setScalar(entry.Content[3], FormatPartitions([]int32{p}))
		list.Content = append(list.Content, entry)
	}
	out, after, err := encodeShardMap(doc)
	if err != nil {
		return nil, err
	}
	if i := after.For(p); i < 0 || after.Shards[i].Name != to {
		return nil, fmt.Errorf("sink: the edited shard map does not give partition %d to shard %s", p, to)
	}
	return out, nil
}

// Repartition returns the shard map file's content b after a
// repartition to `to` partitions: shard owner owns 0..to-1, every other
// shard none. Comments and the other fields are kept; the control shard is
// marked explicitly, as MoveIn does.
func Repartition(b []byte, owner string, to int32) ([]byte, error) {
	doc, list, control, err := editShardMap(b)
	if err != nil {
		return nil, err
	}
	all := All(to)
	found := false
	for _, entry := range list.Content {
		name := field(entry, "name")
		parts := field(entry, "partitions")
		if name == nil || parts == nil {
			return nil, errors.New("sink: a shard of the map has no name or no partitions")
		}
		if name.Value == owner {
			setScalar(parts, FormatPartitions(all))
			found = true
		} else {
			setScalar(parts, FormatPartitions(nil))
		}
		if name.Value == control {
			markControl(entry)
		}
	}
	if !found {
		return nil, fmt.Errorf("sink: the shard map names no shard %q", owner)
	}
	out, after, err := encodeShardMap(doc)
	if err != nil {
		return nil, err
	}
	if err := after.Cover(to); err != nil {
		return nil, fmt.Errorf("sink: the edited shard map: %w", err)
	}
	return out, nil
}

func field(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }

// setScalar sets a partitions value, quoted where YAML would read a
// number.
func setScalar(n *yaml.Node, v string) {
	n.Kind, n.Tag, n.Value, n.Style = yaml.ScalarNode, "!!str", v, 0
	if _, err := strconv.Atoi(v); err == nil {
		n.Style = yaml.DoubleQuotedStyle
	}
}

// CheckWritable fails unless path can be replaced: the file is writable
// and a temporary file can be created next to it (WriteFileAtomic).
func CheckWritable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("sink: the shard map %s: %w", path, err)
	}
	if st.Mode().Perm()&0o222 == 0 {
		return fmt.Errorf("sink: the shard map %s is not writable: its mode is %v (read-only)", path, st.Mode().Perm())
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("sink: the shard map %s is not writable: %w", path, err)
	}
	f.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("sink: the shard map %s cannot be replaced (its directory is not writable): %w", path, err)
	}
	tmp.Close()
	return os.Remove(tmp.Name())
}

// WriteFileAtomic replaces path with b: a temporary file next to it,
// synced, renamed over it (readers see the old map or the new, never half
// of one), keeping the file's permissions.
func WriteFileAtomic(path string, b []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := failpoint.Inject(context.Background(), failpoint.MapBeforeRename); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// editShardMap parses a shard map file's content for editing: the YAML
// document (comments kept), its shards list and the control shard's name.
func editShardMap(b []byte) (doc *yaml.Node, list *yaml.Node, control string, err error) {
	before, err := Parse(b)
	if err != nil {
		return nil, nil, "", err
	}
	doc = &yaml.Node{}
	if err := yaml.Unmarshal(b, doc); err != nil {
		return nil, nil, "", fmt.Errorf("sink: parse the shard map: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, nil, "", errors.New("sink: the shard map is not a mapping")
	}
	list = field(doc.Content[0], "shards")
	if list == nil || list.Kind != yaml.SequenceNode {
		return nil, nil, "", errors.New("sink: the shard map has no shards list")
	}
	return doc, list, before.Shards[before.Control()].Name, nil
}

// encodeShardMap writes an edited document back and checks that it is
// still a valid shard map.
func encodeShardMap(doc *yaml.Node) ([]byte, *Map, error) {
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, nil, fmt.Errorf("sink: write the shard map: %w", err)
	}
	after, err := Parse(out.Bytes())
	if err != nil {
		return nil, nil, fmt.Errorf("sink: the edited shard map does not check: %w", err)
	}
	return out.Bytes(), after, nil
}

// markControl marks a shard entry as the control shard explicitly, so that
// an edit of the partitions never moves the org settings.
func markControl(entry *yaml.Node) {
	if field(entry, "control") == nil {
		entry.Content = append(entry.Content, scalar("control"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
	}
}
