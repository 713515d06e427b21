# mandated: `make` or `make help` lists the targets. Each target's `## text` is its help.
# The test servers are described in test/infra/README.md.

SHELL := bash
.DEFAULT_GOAL := help
INFRA := test/infra

.PHONY: help
help: ## Show this list of targets
	@awk 'BEGIN {FS = ":.*## "} \
		/^##@ / {printf "\n%s\n", substr($$0, 5)} \
		/^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Tests

.PHONY: test test-short
test: ## Run every test under -race, starting (and afterwards stopping) the test servers not already running
	@$(INFRA)/run-tests.sh

test-short: ## The everyday loop (~3 min): the same under -short — no fault suite, e2e, deploy, cluster, private servers, npm/pip or browser (docs/tests.md)
	@MANDATED_TEST_CLUSTER=0 GO_TEST_FLAGS="-short $${GO_TEST_FLAGS:-}" $(INFRA)/run-tests.sh

##@ Test servers (ports, dirs and env vars: test/infra/README.md)

.PHONY: infra-up infra-down kafka-up kafka-down cluster-up cluster-down pg-up pg-down kafka-libs
infra-up: kafka-up pg-up ## Start Kafka (19092), the SASL/SCRAM broker (19192) and PostgreSQL (55432)

infra-down: kafka-down cluster-down pg-down ## Stop every test server, the cluster too, and delete their state
	@rm -rf .infra/run-tests

kafka-up: ## Start the single-node Kafka (19092) and the SASL/SCRAM broker (19192)
	@$(INFRA)/kafka.sh up
	@KAFKA_SASL=1 $(INFRA)/kafka.sh up

kafka-down: ## Stop both single-node brokers and delete their data
	@$(INFRA)/kafka.sh down
	@KAFKA_SASL=1 $(INFRA)/kafka.sh down

cluster-up: ## Start the three-node Kafka cluster (29092, 29094, 29096)
	@$(INFRA)/kafka-cluster.sh up

cluster-down: ## Stop the three-node cluster and delete its data
	@$(INFRA)/kafka-cluster.sh down

pg-up: ## Start PostgreSQL (55432)
	@$(INFRA)/postgres.sh up

pg-down: ## Stop PostgreSQL and delete its data
	@$(INFRA)/postgres.sh down

kafka-libs: ## Resolve the Kafka broker jars from Maven Central (cached per version)
	@$(INFRA)/kafka-libs.sh

##@ Build and lint

.PHONY: build lint cli-docs
build: ## Build mandated, mandatectl, mandate-gateway, mandate-mcp and demo into bin/
	@go build -o bin/ ./cmd/...

cli-docs: ## Write docs/cli, mandatectl's reference, from its command tree (a test fails while it is stale)
	@go run ./cmd/mandatectl docs --dir docs/cli

lint: ## Check gofmt and run go vet
	@files=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$files" ]; then echo "gofmt would change:"; echo "$$files"; exit 1; fi
	@go vet ./...

##@ Demo, benchmarks and chaos

.PHONY: demo chaos rebalance
demo: ## Run the scripted demo: embedded Kafka (kfake) unless KAFKA_BROKERS, throwaway PostgreSQL (55433) unless DATABASE_URL
	@test/infra/demo.sh

chaos: ## 10-minute rotating-fault soak on a private three-node Kafka cluster (MANDATED_CHAOS_DURATION to change)
	@test/infra/chaos.sh

rebalance: ## Measured rebalances with real processes, one test at a time, no -race (scale 3→4→3, kill -9, static rolling restart, 60 s PostgreSQL cut; ~6 min); figures in .infra/rebalance-report.md
	@mkdir -p .infra && MANDATED_REBALANCE_LONG=1 MANDATED_REBALANCE_REPORT=$${MANDATED_REBALANCE_REPORT:-$$PWD/.infra/rebalance-report.md} \
		MANDATED_TEST_CLUSTER=0 GO_TEST_RACE= TEST_PKGS="./test/e2e ./processor" \
		GO_TEST_FLAGS="-v -parallel 1 -timeout 20m -run TestOperators(ScaleThreeFourThree|RollAStaticFleet)|TestAScaleUpKeepsPublishing" $(INFRA)/run-tests.sh

.PHONY: bench
bench: ## Benchmark vs same-run baselines on servers of its own (49092, 55499); QUICK=1: about 4 min; report in test/bench/results/
	@QUICK=$(QUICK) test/bench/bench.sh

.PHONY: probe-gateway
probe-gateway: ## The gateway under 16 HTTP clients for 30 s (real binaries, the test servers of test/infra or MANDATED_TEST_*): requests/s, p50/p99
	@MANDATED_GATEWAY_PROBE=1 go test -count=1 -v -timeout 15m -run TestGatewayProbe ./test/probe/

##@ Try it

.PHONY: dev
dev: ## Kafka, PostgreSQL, mandated and the gateway on this machine with a token and a sample mandate; prints what to type next; Ctrl-C stops it all
	@test/infra/dev.sh
