package validate

import (
	"cmp"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// What the optional Stripe webhook endpoint (`pelguard-consumer webhook`,
// issue 21) is, as the deploy files must run it.
const (
	webhookPath   = "/stripe/webhook"
	webhookPort   = 8089 // --listen's default
	webhookSecret = "PELGUARD_STRIPE_WEBHOOK_SECRET"
)

// Environment the webhook must never get: it faces the internet and needs
// Postgres only, no Stripe API key and no Redis.
var webhookForbidden = []string{"STRIPE_API_KEY", "REDIS_URL"}

// flagValue is --name=value's value in args.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func port(t *testing.T, where, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("%s: address %q has no port", where, addr)
	}
	return int32(n)
}

// The webhook component with an operator's copy of the Ingress example: two
// restricted replicas (TestKustomizeBuildIsRestricted) of `pelguard-consumer
// webhook` holding the signing secret and DATABASE_URL but no Stripe key and
// no Redis URL; probes on the port Stripe reaches; a Service exposing that
// port alone (never the metrics); an Ingress with TLS that routes exactly
// /stripe/webhook to it, and nothing else.
func TestWebhookComponent(t *testing.T) {
	t.Parallel()
	objs := build(t, overlay(t, []string{"webhook"}, "webhook/ingress.example.yaml"))
	var dep *appsv1.Deployment
	var svc *corev1.Service
	var ing *networkingv1.Ingress
	for _, obj := range objs {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			if o.Name == "pelguard-webhook" {
				dep = o
			}
		case *corev1.Service:
			svc = o
		case *networkingv1.Ingress:
			ing = o
		}
	}
	if dep == nil || svc == nil || ing == nil {
		t.Fatalf("the overlay renders Deployment %v, Service %v, Ingress %v: want all three", dep != nil, svc != nil, ing != nil)
	}

	// The Deployment.
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("Deployment %s: replicas %v, want 2 (Stripe keeps an endpoint through a rollout or a drain)", dep.Name, dep.Spec.Replicas)
	}
	if len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment %s: %d containers, want 1", dep.Name, len(dep.Spec.Template.Spec.Containers))
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"/usr/local/bin/pelguard-consumer"}) || len(c.Args) == 0 || c.Args[0] != "webhook" {
		t.Errorf("container %s runs %v %v, want pelguard-consumer webhook", c.Name, c.Command, c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	listen := cmp.Or(flagValue(c.Args, "listen"), ":"+strconv.Itoa(webhookPort))
	if got := port(t, "--listen", listen); ports["webhook"] != got || got != webhookPort {
		t.Errorf("container port webhook %d, --listen %s: want both %d", ports["webhook"], listen, webhookPort)
	}
	metrics := flagValue(c.Args, "metrics-addr")
	if !strings.HasPrefix(metrics, "0.0.0.0:") || ports["ops"] != port(t, "--metrics-addr", metrics) {
		t.Errorf("--metrics-addr %q, container port ops %d: want 0.0.0.0 on the ops port (Prometheus scrapes the pod IP)", metrics, ports["ops"])
	}
	if ports["ops"] == ports["webhook"] {
		t.Errorf("metrics and Stripe's deliveries share port %d: the Ingress would expose /metrics", ports["ops"])
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != intstr.FromString("webhook") {
			t.Errorf("%s probe %+v, want GET /healthz on the webhook port", name, p)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, name := range []string{"DATABASE_URL", webhookSecret} {
		if e, ok := env[name]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Key != name {
			t.Errorf("env %s: %+v, want it from the pelguard Secret's key %s", name, e, name)
		}
	}
	for _, e := range c.Env {
		key := ""
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			key = e.ValueFrom.SecretKeyRef.Key
		}
		for _, bad := range webhookForbidden {
			if strings.HasPrefix(e.Name, bad) || strings.HasPrefix(key, bad) {
				t.Errorf("env %s (Secret key %q): the webhook holds no Stripe API key and no Redis URL", e.Name, key)
			}
		}
	}
	if keys := exampleSecretKeys(t); !keys[webhookSecret] {
		t.Errorf("secret.example.yaml has no %s", webhookSecret)
	}

	// The Service: selects the webhook's pods, and exposes its port alone.
	if svc.Name != "pelguard-webhook" || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service %s selects %v, want the pods of Deployment %s (%v)", svc.Name, svc.Spec.Selector, dep.Name, dep.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != intstr.FromString("webhook") {
		t.Fatalf("Service %s ports %+v, want one, to the container port webhook", svc.Name, svc.Spec.Ports)
	}
	svcPort := svc.Spec.Ports[0]

	// The Ingress: TLS, exactly /stripe/webhook, to the Service's port.
	if len(ing.Spec.TLS) == 0 || ing.Spec.TLS[0].SecretName == "" {
		t.Errorf("Ingress %s: no TLS (Stripe delivers live-mode events over HTTPS only)", ing.Name)
	}
	if ing.Spec.DefaultBackend != nil {
		t.Errorf("Ingress %s has a default backend: every other path would reach it", ing.Name)
	}
	var paths []networkingv1.HTTPIngressPath
	for _, r := range ing.Spec.Rules {
		if r.HTTP != nil {
			paths = append(paths, r.HTTP.Paths...)
		}
	}
	if len(paths) != 1 {
		t.Fatalf("Ingress %s routes %d paths, want /stripe/webhook alone", ing.Name, len(paths))
	}
	p := paths[0]
	var pt networkingv1.PathType
	if p.PathType != nil {
		pt = *p.PathType
	}
	if p.Path != webhookPath || pt != networkingv1.PathTypeExact {
		t.Errorf("Ingress path %q (%q), want %s, Exact (a Prefix would also route /stripe/webhook/…)", p.Path, pt, webhookPath)
	}
	if b := p.Backend.Service; b == nil || b.Name != svc.Name || (b.Port.Name != svcPort.Name && b.Port.Number != svcPort.Port) {
		t.Errorf("Ingress backend %+v, want Service %s port %s", p.Backend, svc.Name, svcPort.Name)
	}
}

// The webhook's systemd unit runs `pelguard-consumer webhook` on loopback
// (a TLS reverse proxy faces Stripe), its metrics on another loopback port,
// with the signing secret from its own environment file and neither the
// consumer's Stripe key (consumer.env) nor the Redis URL. The sandbox, the
// start order and the security score are checked with every unit.
func TestWebhookSystemdUnit(t *testing.T) {
	t.Parallel()
	f := filepath.Join(systemdDir, "pelguard-webhook.service")
	u := parseUnit(t, f)
	exec := strings.Fields(u.last("Service", "ExecStart"))
	if len(exec) < 2 || exec[0] != "/usr/local/bin/pelguard-consumer" || exec[1] != "webhook" {
		t.Fatalf("%s: ExecStart %v, want /usr/local/bin/pelguard-consumer webhook", f, exec)
	}
	listen, metrics := flagValue(exec, "listen"), flagValue(exec, "metrics-addr")
	for name, addr := range map[string]string{"--listen": listen, "--metrics-addr": metrics} {
		if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
			t.Errorf("%s: %s=%q, want 127.0.0.1:<port> (the reverse proxy and the Prometheus agent are local)", f, name, addr)
		}
	}
	if listen == metrics {
		t.Errorf("%s: --listen and --metrics-addr are both %s", f, listen)
	}
	files := u.get("Service", "EnvironmentFile")
	if !slices.Contains(files, "/etc/pelguard/webhook.env") || slices.Contains(files, "/etc/pelguard/consumer.env") {
		t.Errorf("%s: EnvironmentFile=%v, want webhook.env (the signing secret) and not consumer.env (the Stripe key)", f, files)
	}
	unset := strings.Fields(strings.Join(u.get("Service", "UnsetEnvironment"), " "))
	for _, v := range webhookForbidden {
		if !slices.Contains(unset, v) {
			t.Errorf("%s: UnsetEnvironment=%v lacks %s: pelguard.env's value would reach the internet-facing process", f, unset, v)
		}
	}
}
