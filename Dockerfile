# syntax=docker/dockerfile:1
# pelguard's image: the consumer, the reaper, the auditor and the console as static
# binaries named pelguard-consumer, pelguard-reaper, pelguard-auditor,
# pelguard-console in
# /usr/local/bin, on distroless static, running as a numeric non-root user.
#   make image VERSION=1.2.3        (docker, podman or buildah)
# Base images are fully qualified (docker.io/library/…, gcr.io/…): podman
# refuses short names like golang:1.26 unless registries.conf aliases them.
# Without a registry, `make image-local` packs binaries built here
# (Dockerfile.prebuilt, FROM scratch).
# The manifests in deploy/kubernetes pick the binary with `command:`.

# GO_VERSION follows the go directive of go.mod (deploy/validate checks it).
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM docker.io/library/golang:${GO_VERSION}-bookworm AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    for b in consumer reaper auditor console; do \
      CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
        -ldflags "-s -w -X github.com/pelguard/pelguard/internal/version.Version=${VERSION}" \
        -o /out/pelguard-$b ./cmd/$b || exit 1; \
    done

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="pelguard" \
      org.opencontainers.image.description="Redis Streams made safe for Stripe billing: consumer, reaper, auditor" \
      org.opencontainers.image.source="https://github.com/pelguard/pelguard" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/ /usr/local/bin/
# 65532 is distroless' "nonroot"; numeric, so runAsNonRoot can verify it.
USER 65532:65532
CMD ["pelguard-consumer", "--help"]
