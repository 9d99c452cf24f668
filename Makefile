# delaybridge: build, test and local services.
# `make test` is THE test command: the README and .ci/run both call it.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

SERVICES := scripts/services.sh
# Export the settings of the local services (DELAYBRIDGE_*) into the recipe's shell.
WITH_SERVICES_ENV := set -a; eval "$$($(SERVICES) env)"; set +a;
STATICCHECK_VERSION := v0.8.2
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: services services-down test test-unit demo bench lint

services:
	$(SERVICES) up

services-down:
	$(SERVICES) down

# Lint, start (or reuse) the services, then every test against them.
test: lint services
	$(WITH_SERVICES_ENV) go test -count=1 -timeout 40m ./...

# Unit tests only: no services needed.
test-unit:
	go test -short ./...

# For now the smallest end-to-end path: each service round-trips a message.
demo: services
	$(WITH_SERVICES_ENV) go test -count=1 -run TestEnvironment -v ./integration/

bench: services
	$(WITH_SERVICES_ENV) go test -run '^$$' -bench . -benchtime 1x ./...

lint:
	@unformatted="$$(gofmt -l .)"; \
	if [[ -n "$$unformatted" ]]; then echo "gofmt -l: not formatted:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	$(STATICCHECK) ./...
