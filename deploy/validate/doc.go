// Package validate checks pelguard's deploy/ files offline, with the tools
// of the ecosystem they target. It is a module of its own so that pelguard's
// module never depends on k8s.io. Its tests:
//
//   - Kubernetes: every manifest decodes strictly into the k8s.io/api types
//     (an unknown or duplicate field is an error), the kustomization builds
//     with kustomize's own library and lists every manifest, and every pod
//     passes Pod Security "restricted" (k8s.io/pod-security-admission's
//     evaluator, latest version), alone and with every optional component
//     (podmonitor/, webhook/ with its Ingress example). The webhook
//     endpoint holds no Stripe key and no Redis URL, and its Service and
//     Ingress expose exactly /stripe/webhook, never the metrics.
//   - systemd: `systemd-analyze security --offline` rates each unit <= 3.0,
//     `systemd-analyze verify` finds nothing, the sysusers.d file creates
//     the user, the start order survives a late Postgres, the webhook unit
//     reads neither the Stripe key nor the Redis URL.
//   - Prometheus: `promtool check rules` and `promtool test rules`, a unit
//     test for every alert, dashboard queries that parse and do not depend
//     on the job label.
//   - The image: built where docker, podman or buildah works; elsewhere the
//     Dockerfile's own build command is run on its build context.
//
// Tools missing from the machine are installed from Debian's packages when
// possible; a test that cannot get its tool skips with a message, except
// under CI=true, where it fails. Run with `make deploy-check` (part of
// `make test`) or `cd deploy/validate && go test ./...`.
package validate
