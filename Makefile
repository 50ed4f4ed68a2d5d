# pelguard — `make help` lists the targets.
GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
SERVICES  := scripts/services.sh run
PKGS      := ./...
BENCHTIME ?= 1x
BENCHCOUNT ?= 5
# Installed and shipped names: `go install ./cmd/...` gives consumer, reaper,
# auditor; `make install` and the image give pelguard-consumer, ….
ROLES     := consumer reaper auditor console
PREFIX    ?= /usr/local
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/pelguard/pelguard/internal/version.Version=$(VERSION)
IMAGE     ?= ghcr.io/pelguard/pelguard

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

install: ## Build static binaries into $PREFIX/bin (/usr/local/bin) as pelguard-consumer, -reaper, -auditor, -console
	@mkdir -p "$(DESTDIR)$(PREFIX)/bin"
	@for b in $(ROLES); do \
		echo "installing $(DESTDIR)$(PREFIX)/bin/pelguard-$$b"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o "$(DESTDIR)$(PREFIX)/bin/pelguard-$$b" ./cmd/$$b || exit 1; \
	done

image: ## Build ghcr.io/pelguard/pelguard:$VERSION with docker, podman or buildah (none: a hint; fails if REQUIRE_BUILDER=1 or CI=true)
	@if docker info >/dev/null 2>&1; then set -x; DOCKER_BUILDKIT=1 docker build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .; \
	elif command -v podman >/dev/null; then set -x; podman build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .; \
	elif command -v buildah >/dev/null; then set -x; buildah build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .; \
	else echo "make image: no container builder: start a Docker engine (https://docs.docker.com/engine/install/)"; \
		echo "  or install podman or buildah (Debian: apt-get install -y podman)"; \
		if [ "$(REQUIRE_BUILDER)" = 1 ] || [ "$$CI" = true ]; then exit 1; fi; fi

deploy-check: ## Validate deploy/: Kubernetes types + Pod Security restricted, systemd-analyze, promtool
	cd deploy/validate && $(GO) test -count=1 ./...

test: tools deploy-check ## Run every test with -race against real Redis and Postgres (examples/embed too), and deploy-check
	$(SERVICES) $(GO) test -race -timeout 25m -count=1 $(PKGS)
	$(SERVICES) $(GO) -C examples/embed test -race -timeout 10m -count=1 ./...

bench: tools ## Run the benchmarks (BENCHCOUNT runs each; compare medians)
	$(SERVICES) $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count $(BENCHCOUNT) -timeout 60m $(PKGS)

demo: ## Run the drill: the seed's three failure modes, naive vs pelguard
	$(SERVICES) $(GO) run ./cmd/chaos $(ARGS)

FUZZTIME ?= 60s
fuzz: ## Fuzz the event parser, then every binary's start-up with malformed secrets (FUZZTIME each, 60s)
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./event/
	$(GO) test -run '^$$' -fuzz FuzzStartupSecrets -fuzztime $(FUZZTIME) ./internal/cli/

lint: ## go vet, gofmt check, staticcheck when it installs
	$(GO) vet $(PKGS)
	cd deploy/validate && $(GO) vet ./...
	$(GO) -C examples/embed vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@if $(GO) install honnef.co/go/tools/cmd/staticcheck@latest 2>/dev/null; then $(GOBIN)/staticcheck $(PKGS); \
		else echo "staticcheck not installable here; skipped"; fi

.PHONY: help services cluster services-stop tools build install image deploy-check test bench demo fuzz lint
