package wire

import "embed"

// Schemas holds the JSON Schemas (draft 2020-12) of wire contract v1:
// one per command type (grant.schema.json … resolve.schema.json),
// command.schema.json (any command, one of them by "type"),
// decision.schema.json, and defs.schema.json (the types they share). Each
// file's $id is SchemaBaseURL followed by its name, and they refer to each
// other by those names.
//
// The schemas describe what Decode accepts as closely as JSON Schema can; a
// record valid against them may still be refused for what the schemas
// cannot say (duplicate keys, 1e2 as an integer, a record key that names
// another mandate; defs.schema.json lists these). Decode is the contract.
//
//go:embed schema/*.json
var Schemas embed.FS

// SchemaBaseURL is the base of every schema's $id.
const SchemaBaseURL = "https://github.com/mandated/mandated/wire/schema/"
