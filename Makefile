# pelguard — `make help` lists the targets.
GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
SERVICES  := scripts/services.sh run
PKGS      := ./...
BENCHTIME ?= 1x
BENCHCOUNT ?= 5
# BenchmarkUsageAtScale takes about 5 minutes a run: SCALECOUNT runs of it.
SCALECOUNT ?= 1
# One name per binary: `make build`, `make install`, releases and the image
# all give pelguard-consumer, -reaper, -auditor, -console (the names help,
# docs and units use). A bare `go install ./cmd/...` names them after their
# directories; prefer the targets.
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

build: ## Build every binary into bin/, under its installed name (pelguard-consumer, …; stripesim, chaos)
	@mkdir -p bin
	@for b in $(ROLES); do $(GO) build -ldflags "$(LDFLAGS)" -o bin/pelguard-$$b ./cmd/$$b || exit 1; done
	$(GO) build -o bin/ ./cmd/stripesim ./cmd/chaos

install: ## Build static binaries into $PREFIX/bin (/usr/local/bin) as pelguard-consumer, -reaper, -auditor, -console
	@mkdir -p "$(DESTDIR)$(PREFIX)/bin"
	@for b in $(ROLES); do \
		echo "installing $(DESTDIR)$(PREFIX)/bin/pelguard-$$b"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o "$(DESTDIR)$(PREFIX)/bin/pelguard-$$b" ./cmd/$$b || exit 1; \
	done

# The container builder the image targets use: docker when its engine
# answers, else podman, else buildah; none: b is empty.
FIND_BUILDER = if docker info >/dev/null 2>&1; then b=docker; \
	elif command -v podman >/dev/null 2>&1; then b=podman; \
	elif command -v buildah >/dev/null 2>&1; then b=buildah; else b=; fi
# What a target that builds nothing says, and its exit: 1 unless SKIP_IMAGE=1.
NO_IMAGE = { echo "make $@: no container builder: start a Docker engine (https://docs.docker.com/engine/install/)"; \
	echo "  or install podman or buildah (Debian: apt-get install -y podman)."; \
	if [ "$(SKIP_IMAGE)" = 1 ]; then echo "make $@: SKIP_IMAGE=1: no image built"; exit 0; fi; \
	echo "make $@: no image built (SKIP_IMAGE=1 to go on without one)"; exit 1; }
IMAGE_ROOT  := bin/image-root
RELEASE_VERSION = $(patsubst v%,%,$(VERSION))
RELEASE_DIR ?= dist/$(RELEASE_VERSION)
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64

image: image-local ## Build $IMAGE:$VERSION offline: this machine's static binaries FROM scratch (image-local); image-dockerfile builds from the Dockerfile instead

image-dockerfile: ## Build $IMAGE:$VERSION from the Dockerfile with docker, podman or buildah (pulls docker.io and gcr.io bases); no builder: fails unless SKIP_IMAGE=1
	@if [ "$(SKIP_IMAGE)" = 1 ]; then echo "make $@: SKIP_IMAGE=1: no image built"; exit 0; fi; \
	$(FIND_BUILDER); [ -n "$$b" ] || $(NO_IMAGE); \
	set -x; DOCKER_BUILDKIT=1 $$b build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

image-local: ## Pack static binaries built here into $IMAGE:$VERSION FROM scratch (Dockerfile.prebuilt): no registry needed. BINDIR=dir packs those instead
	@if [ "$(SKIP_IMAGE)" = 1 ]; then echo "make $@: SKIP_IMAGE=1: no image built"; exit 0; fi; \
	$(FIND_BUILDER); [ -n "$$b" ] || $(NO_IMAGE); \
	test -s /etc/ssl/certs/ca-certificates.crt || { echo "make $@: no /etc/ssl/certs/ca-certificates.crt to give the image (Debian: apt-get install -y ca-certificates)"; exit 1; }; \
	rm -rf $(IMAGE_ROOT) && mkdir -p $(IMAGE_ROOT)/etc/ssl/certs $(IMAGE_ROOT)/usr/local/bin || exit 1; \
	if [ -n "$(BINDIR)" ]; then \
		for r in $(ROLES); do cp "$(BINDIR)/pelguard-$$r" $(IMAGE_ROOT)/usr/local/bin/ || exit 1; done; \
	else $(MAKE) --no-print-directory install DESTDIR="$(CURDIR)/$(IMAGE_ROOT)" PREFIX=/usr/local VERSION=$(VERSION) || exit 1; fi; \
	cp /etc/ssl/certs/ca-certificates.crt $(IMAGE_ROOT)/etc/ssl/certs/ && \
	printf 'nonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' > $(IMAGE_ROOT)/etc/passwd && \
	printf 'nonroot:x:65532:\n' > $(IMAGE_ROOT)/etc/group && \
	set -x && $$b build -f Dockerfile.prebuilt --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) $(IMAGE_ROOT)

release: ## dist/$VERSION: static binaries per RELEASE_PLATFORMS, tarballs, SHA256SUMS; then the image (image-local) where a builder runs
	@case "$(RELEASE_VERSION)" in dev|*dirty*) if [ "$(ALLOW_DIRTY)" != 1 ]; then \
		echo "make release: VERSION=$(VERSION): commit, then tag (git tag v0.1.0), or ALLOW_DIRTY=1"; exit 1; fi;; esac; \
	rm -rf "$(RELEASE_DIR)" && mkdir -p "$(RELEASE_DIR)" || exit 1; \
	for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; d=pelguard-$(RELEASE_VERSION)-$$os-$$arch; mkdir -p "$(RELEASE_DIR)/$$d" || exit 1; \
		for r in $(ROLES); do echo "building $(RELEASE_DIR)/$$d/pelguard-$$r"; \
			CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath \
				-ldflags "-s -w -X github.com/pelguard/pelguard/internal/version.Version=$(RELEASE_VERSION)" \
				-o "$(RELEASE_DIR)/$$d/pelguard-$$r" ./cmd/$$r || exit 1; \
		done; \
		tar -C "$(RELEASE_DIR)" -czf "$(RELEASE_DIR)/$$d.tar.gz" "$$d" || exit 1; \
	done; \
	(cd "$(RELEASE_DIR)" && sha256sum *.tar.gz */pelguard-* > SHA256SUMS) || exit 1; \
	echo "$(RELEASE_DIR)/SHA256SUMS:"; cat "$(RELEASE_DIR)/SHA256SUMS"; \
	$(FIND_BUILDER); host=pelguard-$(RELEASE_VERSION)-linux-$$($(GO) env GOARCH); \
	if [ -z "$$b" ] || [ "$(SKIP_IMAGE)" = 1 ] || [ ! -d "$(RELEASE_DIR)/$$host" ]; then \
		echo "make release: no image built (no container builder, SKIP_IMAGE=1, or no linux/$$($(GO) env GOARCH) in RELEASE_PLATFORMS)"; \
		echo "  build it where a builder runs: make image-local VERSION=$(RELEASE_VERSION) BINDIR=$(RELEASE_DIR)/$$host"; \
	else $(MAKE) --no-print-directory image-local VERSION=$(RELEASE_VERSION) BINDIR="$(RELEASE_DIR)/$$host"; fi

# docs is also a directory: always run the target.
.PHONY: docs
docs: ## Regenerate docs/reference/ from the code (flags, exit codes, metrics, alerts, tables); make test checks it is current
	$(SERVICES) $(GO) test -count=1 -run '^TestReferenceUpToDate$$' ./internal/testkit/refdocs -update

DEPLOY_CHECK = cd deploy/validate && $(GO) test -timeout 20m -count=1 ./...
deploy-check: ## Validate deploy/: Kubernetes types + Pod Security restricted, systemd-analyze, promtool
	$(DEPLOY_CHECK)

# deploy-check runs beside the tests (its output, in bin/deploy-check.log, is
# printed after them): it is mostly compiling, and the tests leave a core idle
# much of the time.
test: tools ## Run every test with -race against real Redis and Postgres (examples/embed too), and deploy-check
	@mkdir -p bin; { ($(DEPLOY_CHECK)) > bin/deploy-check.log 2>&1; echo $$? > bin/deploy-check.rc; } & \
	$(SERVICES) $(GO) test -race -timeout 25m -count=1 $(PKGS); rc=$$?; \
	wait; echo "make deploy-check (beside the tests):"; cat bin/deploy-check.log; \
	if [ "$$(cat bin/deploy-check.rc)" != 0 ]; then echo "make test: deploy-check failed (above)"; exit 1; fi; exit $$rc
	$(SERVICES) $(GO) -C examples/embed test -race -timeout 10m -count=1 ./...

bench: tools ## Run the benchmarks (BENCHCOUNT runs each, SCALECOUNT of the full-scale usage run; compare medians)
	$(SERVICES) $(GO) test -run '^$$' -bench . -skip '^BenchmarkUsageAtScale$$' -benchtime $(BENCHTIME) -count $(BENCHCOUNT) -timeout 60m $(PKGS)
	$(SERVICES) $(GO) test -run '^$$' -bench '^BenchmarkUsageAtScale$$' -benchtime 1x -count $(SCALECOUNT) -timeout 30m ./consumer/

SOAK_DURATION ?= 30m
soak: ## Run the fleet as processes for SOAK_DURATION (30m; not in make test or CI): Redis, tables, RSS, goroutines sampled each minute, slopes, 0 duplicates, nothing lost (samples in bin/soak)
	@mkdir -p bin/soak
	$(SERVICES) env SOAK_DURATION=$(SOAK_DURATION) SOAK_OUT=$(CURDIR)/bin/soak $(GO) test -tags pelguard_soak -count=1 -v \
		-timeout 3h -run '^TestSoak$$' ./internal/testkit/e2e/

DEMO_HTML ?= bin/drill-report.html
demo: ## Run the drill: three failure modes, a naive consumer vs pelguard; writes the HTML report to $DEMO_HTML (bin/drill-report.html)
	@mkdir -p $(dir $(DEMO_HTML))
	$(SERVICES) $(GO) run ./cmd/chaos --html $(DEMO_HTML) $(ARGS)

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

.PHONY: help services cluster services-stop tools build install image image-local image-dockerfile release deploy-check test bench soak demo fuzz lint
