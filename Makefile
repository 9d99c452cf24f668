# delaybridge: build, test and local services.
# `make test` is THE test command: the README and .ci/run both call it.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

SERVICES := scripts/services.sh
# Export the settings of the local services (DELAYBRIDGE_*) into the recipe's shell.
WITH_SERVICES_ENV := set -a; eval "$$($(SERVICES) env)"; set +a;
STATICCHECK_VERSION := v0.8.2
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: services services-down tools test test-unit demo bench chaos lint fuzz FORCE

services:
	$(SERVICES) up

services-down:
	$(SERVICES) down

# Chromium (the console's browser tests) and promtool, from Debian's packages.
tools:
	scripts/tools.sh

# Lint, start (or reuse) the services, then every test against them, one
# package at a time: some tests restart a broker, which must not hit another
# package's tests mid-flight. Then a short run of every fuzz target.
test: lint services tools
	promtool check rules deploy/prometheus/*.yml && promtool test rules deploy/prometheus/tests/*.yml
	$(WITH_SERVICES_ENV) go test -count=1 -p 1 -timeout 40m ./...
	$(MAKE) fuzz FUZZTIME=100000x

# Each fuzz target for FUZZTIME executions (default 2000000x, about a minute
# each here); a failing input lands in the package's testdata/fuzz/<Target>/.
# Commit such an input as a regression test; the inputs a run merely found
# interesting stay in the Go build cache. A count, not a duration: with a
# duration Go's fuzzing coordinator can fail a target that found nothing
# with a bare "context deadline exceeded" as the time runs out (a race in
# the coordinator, golang/go#75804), which a loaded box hits.
FUZZTIME ?= 2000000x
fuzz:
	go test -run '^$$' -fuzz '^FuzzLimitsPlan$$' -fuzztime $(FUZZTIME) ./internal/broker/
	go test -run '^$$' -fuzz '^FuzzPlanChainMakesProgress$$' -fuzztime $(FUZZTIME) ./internal/broker/
	go test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/broker/
	go test -run '^$$' -fuzz '^FuzzDeadMessage$$' -fuzztime $(FUZZTIME) ./internal/broker/
	go test -run '^$$' -fuzz '^FuzzDecodeHeaders$$' -fuzztime $(FUZZTIME) ./internal/store/
	go test -run '^$$' -fuzz '^FuzzFromTable$$' -fuzztime $(FUZZTIME) ./internal/rabbit/
	go test -run '^$$' -fuzz '^FuzzParseWhen$$' -fuzztime $(FUZZTIME) ./cmd/delaybridge/internal/cli/
	go test -run '^$$' -fuzz '^FuzzParseWhenSigns$$' -fuzztime $(FUZZTIME) ./cmd/delaybridge/internal/cli/
	go test -run '^$$' -fuzz '^FuzzParseConfigFile$$' -fuzztime $(FUZZTIME) ./internal/settings/
	go test -run '^$$' -fuzz '^FuzzParseLevelsSetting$$' -fuzztime $(FUZZTIME) ./internal/rocket/

# Unit tests only: no services needed.
test-unit:
	go test -short ./...

# The order-timeout story end to end, once per broker (see README).
demo: services bin/delaybridge
	$(WITH_SERVICES_ENV) bin/delaybridge demo --broker rabbit --log-level warn
	$(WITH_SERVICES_ENV) bin/delaybridge demo --broker rocket --log-level warn

bin/delaybridge: FORCE
	go build -o bin/delaybridge ./cmd/delaybridge

FORCE:

# The long fault run (integration/fault_test.go): CHAOS_TASKS tasks over both
# brokers while every fault is injected, repeatedly; the result table lands
# in RELIABILITY.chaos.md (git-ignored) and the process logs in .chaos/.
# CHAOS_RATE is tasks scheduled per second per broker.
CHAOS_TASKS ?= 200000
CHAOS_RATE ?= 150
chaos: services
	$(WITH_SERVICES_ENV) CI=true DELAYBRIDGE_CHAOS_TASKS=$(CHAOS_TASKS) DELAYBRIDGE_CHAOS_RATE=$(CHAOS_RATE) DELAYBRIDGE_FAULT_REPORT=$(CURDIR)/RELIABILITY.chaos.md \
		DELAYBRIDGE_FAULT_LOGS=$(CURDIR)/.chaos go test -count=1 -run '^TestFaults_' -v -timeout 90m ./integration/

bench: services
	$(WITH_SERVICES_ENV) go test -run '^$$' -bench . -benchtime 1x ./...

lint:
	@unformatted="$$(gofmt -l .)"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt -l: not formatted:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	$(STATICCHECK) ./...
