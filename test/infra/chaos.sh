#!/usr/bin/env bash
# chaos.sh: `make chaos`. The rotating-fault soak (test/fault) for
# MANDATED_CHAOS_DURATION (default 10m) against a private three-node Kafka
# cluster and a private PostgreSQL, both started and removed by the test on
# free ports. Results (JSON + summary) land in .infra/chaos-results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

go mod download
bash test/infra/kafka-libs.sh >/dev/null
export MANDATED_CHAOS_DURATION=${MANDATED_CHAOS_DURATION:-10m}
export MANDATED_CHAOS_CLUSTER=1
export MANDATED_FAULT_RESULTS=${MANDATED_FAULT_RESULTS:-$PWD/.infra/chaos-results}
mkdir -p "$MANDATED_FAULT_RESULTS"
echo "chaos: ${MANDATED_CHAOS_DURATION} of rotating faults on a three-node cluster; results in $MANDATED_FAULT_RESULTS" >&2
go test -race -count=1 -timeout 60m -v -run 'TestRotatingFaultsKeepEveryInvariant$' ./test/fault/ 2>&1 |
	grep -v '^\s*{"level' | tee "$MANDATED_FAULT_RESULTS/chaos-$(date -u +%Y%m%dT%H%M%SZ).log"
exit "${PIPESTATUS[0]}"
