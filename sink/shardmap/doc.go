// Package shardmap owns the shard map: which PostgreSQL database holds
// which partitions (docs/operating.md, "Scaling out PostgreSQL"). It parses
// and validates the map, edits its file for a move or a repartition without
// losing the operator's comments, writes it atomically, and takes the file
// lock that keeps two editors apart.
//
// It is a file and YAML package: it must never import the PostgreSQL driver
// (test/layout checks it). The runtime sink opens the databases a map
// names; the admin package edits the map while it moves partitions.
package shardmap
