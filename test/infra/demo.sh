#!/usr/bin/env bash
# demo.sh: `make demo`. Runs cmd/demo on its embedded defaults: an in-process
# Kafka-protocol broker (kfake) unless KAFKA_BROKERS is set, and a throwaway
# PostgreSQL on 127.0.0.1:55433 (removed afterwards) unless DATABASE_URL is set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

go mod download
if [ -z "${DATABASE_URL:-}" ]; then
	export PG_PORT=${DEMO_PG_PORT:-55433}
	trap 'bash test/infra/postgres.sh down >/dev/null 2>&1 || true' EXIT
	bash test/infra/postgres.sh up >&2
	DATABASE_URL=$(bash test/infra/postgres.sh url)
	export DATABASE_URL
fi
go run ./cmd/demo "$@"
