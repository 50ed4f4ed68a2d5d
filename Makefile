# pelguard — `make help` lists the targets.
GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
SERVICES  := scripts/services.sh run
PKGS      := ./...
BENCHTIME ?= 1x
BENCHCOUNT ?= 5

.DEFAULT_GOAL := help

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

services: ## Make Redis and Postgres reachable; prints the exports (make services-stop ends them)
	@scripts/services.sh env

cluster: ## Start a local Redis Cluster (3 masters + 3 replicas); prints its REDIS_URL (make services-stop ends it)
	@scripts/services.sh cluster

services-stop: ## Stop services that `make services` or `make cluster` started
	@scripts/services.sh stop

tools: ## Install stripe-mock (Stripe's official request-shape checker) if missing
	@test -x "$(GOBIN)/stripe-mock" || command -v stripe-mock >/dev/null || \
		$(GO) install github.com/stripe/stripe-mock@v0.203.0

build: ## Build every binary into bin/
	$(GO) build -o bin/ ./cmd/...

test: tools ## Run every test with -race against real Redis and Postgres
	$(SERVICES) $(GO) test -race -timeout 25m -count=1 $(PKGS)

bench: tools ## Run the benchmarks (BENCHCOUNT runs each; compare medians)
	$(SERVICES) $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count $(BENCHCOUNT) -timeout 60m $(PKGS)

demo: ## Run the drill: the seed's three failure modes, naive vs pelguard
	$(SERVICES) $(GO) run ./cmd/chaos $(ARGS)

fuzz: ## Fuzz the event parser for a minute
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s ./event/

lint: ## go vet, gofmt check, staticcheck when it installs
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@if $(GO) install honnef.co/go/tools/cmd/staticcheck@latest 2>/dev/null; then $(GOBIN)/staticcheck $(PKGS); \
		else echo "staticcheck not installable here; skipped"; fi

.PHONY: help services cluster services-stop tools build test bench demo fuzz lint
