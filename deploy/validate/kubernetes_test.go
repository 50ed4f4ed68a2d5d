package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	kubeDir   = "../kubernetes"
	namespace = "pelguard"
	imageName = "ghcr.io/pelguard/pelguard"
)

// The binaries the image ships, by the name the manifests run them under.
var shipped = []string{"/usr/local/bin/pelguard-consumer", "/usr/local/bin/pelguard-reaper", "/usr/local/bin/pelguard-auditor"}

// strictDecoder decodes YAML or JSON into the registered k8s.io/api (and
// Prometheus Operator) types; an unknown or duplicate field is an error.
var strictDecoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(appsv1.AddToScheme(s))
	utilruntime.Must(batchv1.AddToScheme(s))
	utilruntime.Must(networkingv1.AddToScheme(s))
	utilruntime.Must(monitoringv1.AddToScheme(s))
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

func decodeStrict(b []byte) (runtime.Object, error) {
	obj, _, err := strictDecoder.Decode(b, nil, nil)
	return obj, err
}

// manifests returns every .yaml file under deploy/kubernetes.
func manifests(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(kubeDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") {
			out = append(out, p)
		}
		return err
	})
	if err != nil || len(out) < 8 {
		t.Fatalf("manifests under %s: %v %v", kubeDir, out, err)
	}
	return out
}

func isKustomization(p string) bool { return filepath.Base(p) == "kustomization.yaml" }

func readKustomization(t *testing.T, p string) kustypes.Kustomization {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var k kustypes.Kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return k
}

// releaseTag is the image tag the kustomization pins.
func releaseTag(t *testing.T) string {
	t.Helper()
	k := readKustomization(t, filepath.Join(kubeDir, "kustomization.yaml"))
	tag := ""
	for _, img := range k.Images {
		if img.Name == imageName {
			tag = img.NewTag
		}
	}
	if tag == "" || tag == "latest" {
		t.Errorf("kustomization.yaml: images must pin %s to a release tag, got %q", imageName, tag)
	}
	return tag
}

// Every manifest decodes strictly into its Kubernetes type: a misspelt field
// (readOnlyRootFilesytem) would otherwise be dropped by the API server
// without a word, and the pod would run without it. Applied without
// kustomize (kubectl apply -f), a workload runs the same release image.
func TestManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	tag := releaseTag(t)
	for _, p := range manifests(t) {
		if isKustomization(p) {
			readKustomization(t, p)
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(b)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if _, tmpl := podTemplate(obj); tmpl != nil {
			for _, c := range tmpl.Spec.Containers {
				if c.Image != imageName+":"+tag {
					t.Errorf("%s: image %s, want %s:%s (the kustomization's tag)", p, c.Image, imageName, tag)
				}
			}
		}
	}
	// The decoder is strict: a known typo is refused.
	typo := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers:\n    - name: c\n      image: i\n      securityContext:\n        readOnlyRootFilesytem: true\n"
	if _, err := decodeStrict([]byte(typo)); err == nil || !strings.Contains(err.Error(), "readOnlyRootFilesytem") {
		t.Errorf("strict decoding accepted an unknown field: %v", err)
	}
}

// The default kustomization lists every manifest of deploy/kubernetes but
// the *.example.yaml ones (never applied: example values must not overwrite
// a real Secret); each subdirectory is an optional kustomize Component that
// lists every manifest of its own but its examples (the Ingress: a host to
// fill in).
func TestKustomizationListsEveryManifest(t *testing.T) {
	t.Parallel()
	k := readKustomization(t, filepath.Join(kubeDir, "kustomization.yaml"))
	entries, err := os.ReadDir(kubeDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.IsDir():
			c := readKustomization(t, filepath.Join(kubeDir, name, "kustomization.yaml"))
			if c.Kind != kustypes.ComponentKind {
				t.Errorf("%s/kustomization.yaml: kind %q, want %s (optional, not in the default build)", name, c.Kind, kustypes.ComponentKind)
			}
			for _, r := range c.Resources {
				if _, err := os.Stat(filepath.Join(kubeDir, name, r)); err != nil {
					t.Errorf("%s lists %s: %v", name, r, err)
				}
			}
			files, _ := filepath.Glob(filepath.Join(kubeDir, name, "*.yaml"))
			for _, f := range files {
				base := filepath.Base(f)
				switch listed := slices.Contains(c.Resources, base); {
				case base == "kustomization.yaml":
				case strings.HasSuffix(base, ".example.yaml") && listed:
					t.Errorf("%s/kustomization.yaml applies the example %s", name, base)
				case !strings.HasSuffix(base, ".example.yaml") && !listed:
					t.Errorf("%s/kustomization.yaml does not list %s", name, base)
				}
			}
		case name == "kustomization.yaml" || !strings.HasSuffix(name, ".yaml"):
		case strings.HasSuffix(name, ".example.yaml"):
			if slices.Contains(k.Resources, name) {
				t.Errorf("kustomization.yaml applies the example %s", name)
			}
		case !slices.Contains(k.Resources, name):
			t.Errorf("kustomization.yaml does not list %s", name)
		}
	}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join(kubeDir, r)); err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", r, err)
		}
	}
}

// build runs kustomize (its library, as `kubectl apply -k` does) on dir and
// decodes every resource it renders, strictly.
func build(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []runtime.Object
	for _, r := range m.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj, err := decodeStrict(b)
		if err != nil {
			t.Fatalf("%s %s as rendered: %v", r.GetKind(), r.GetName(), err)
		}
		out = append(out, obj)
	}
	return out
}

// components are the optional kustomize Components, each a subdirectory of
// deploy/kubernetes.
var components = []string{"podmonitor", "webhook"}

// The switching component (deploy/kubernetes/switching) is an alternative
// for teams moving from their own consumer, not an add-on: it is built on
// its own (TestSwitchingComponent), not with every component.

// overlay writes an overlay of the base with the given components, as the
// comments in their kustomization.yaml tell an operator to, plus copies of
// extra files (the examples an operator copies into the overlay and lists
// in its resources), and returns its directory.
func overlay(t *testing.T, comps []string, extra ...string) string {
	t.Helper()
	base, err := filepath.Abs(kubeDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var k strings.Builder
	fmt.Fprintf(&k, "resources:\n  - %s\n", rel(base))
	for _, f := range extra {
		b, err := os.ReadFile(filepath.Join(kubeDir, f))
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&k, "  - %s\n", name)
	}
	k.WriteString("components:\n")
	for _, c := range comps {
		fmt.Fprintf(&k, "  - %s\n", rel(filepath.Join(base, c)))
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// podTemplate is the pod a workload runs, or nil for other kinds.
func podTemplate(obj runtime.Object) (string, *corev1.PodTemplateSpec) {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return "Deployment " + o.Name, &o.Spec.Template
	case *appsv1.StatefulSet:
		return "StatefulSet " + o.Name, &o.Spec.Template
	case *batchv1.Job:
		return "Job " + o.Name, &o.Spec.Template
	case *batchv1.CronJob:
		return "CronJob " + o.Name, &o.Spec.JobTemplate.Spec.Template
	case *corev1.Pod:
		return "Pod " + o.Name, &corev1.PodTemplateSpec{ObjectMeta: o.ObjectMeta, Spec: o.Spec}
	}
	return "", nil
}

var evaluator = func() policy.Evaluator {
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	utilruntime.Must(err)
	return e
}()

// restricted returns why Pod Security "restricted" (latest) rejects a pod.
func restricted(tmpl *corev1.PodTemplateSpec) string {
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	agg := policy.AggregateCheckResults(evaluator.EvaluatePod(lv, &tmpl.ObjectMeta, &tmpl.Spec))
	if agg.Allowed {
		return ""
	}
	return agg.ForbiddenDetail()
}

// `kubectl apply -k deploy/kubernetes`, rendered offline, alone and in an
// overlay with every optional component and example: the Namespace
// enforces Pod Security "restricted" and every pod passes it; beyond it,
// read-only root filesystems, no service account token, the release image
// (not :latest) running a shipped binary, resource requests, and env taken
// only from the pelguard ConfigMap and keys the example Secret has.
func TestKustomizeBuildIsRestricted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		dir       func(*testing.T) string
		workloads int
	}{
		{"base", func(*testing.T) string { return kubeDir }, 4},
		{"every component", func(t *testing.T) string { return overlay(t, components, "webhook/ingress.example.yaml") }, 5},
		{"switching", func(t *testing.T) string { return overlay(t, []string{"switching"}) }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkRestricted(t, build(t, tc.dir(t)), tc.workloads)
		})
	}
}

// checkRestricted is TestKustomizeBuildIsRestricted's check of one build,
// which must run at least want workloads (the base: the migrate Job and
// three Deployments; the webhook adds one).
func checkRestricted(t *testing.T, objs []runtime.Object, want int) {
	t.Helper()
	tag := releaseTag(t)
	secretKeys := exampleSecretKeys(t)
	configMaps := map[string]bool{}
	var ns *corev1.Namespace
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.Namespace:
			ns = o
		case *corev1.ConfigMap:
			configMaps[o.Name] = true
		}
		if m, err := metaOf(obj); err == nil && m.GetNamespace() != namespace && m.GetName() != namespace {
			t.Errorf("%T %s: namespace %q, want %s", obj, m.GetName(), m.GetNamespace(), namespace)
		}
	}
	if ns == nil {
		t.Fatal("no Namespace in the build")
	}
	pol, errs := psaapi.PolicyToEvaluate(ns.Labels, psaapi.Policy{})
	if len(errs) > 0 || pol.Enforce.Level != psaapi.LevelRestricted || !pol.Enforce.Version.Latest() {
		t.Errorf("Namespace %s enforces %s (%v), want restricted:latest", ns.Name, pol.Enforce.String(), errs)
	}
	workloads := 0
	for _, obj := range objs {
		what, tmpl := podTemplate(obj)
		if tmpl == nil {
			continue
		}
		workloads++
		if why := restricted(tmpl); why != "" {
			t.Errorf("%s violates Pod Security restricted: %s", what, why)
		}
		if a := tmpl.Spec.AutomountServiceAccountToken; a == nil || *a {
			t.Errorf("%s: automountServiceAccountToken must be false (pelguard never calls the API server)", what)
		}
		for _, c := range tmpl.Spec.Containers {
			where := fmt.Sprintf("%s container %s", what, c.Name)
			if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: readOnlyRootFilesystem must be true", where)
			}
			if c.Image != imageName+":"+tag {
				t.Errorf("%s: image %s, want %s:%s", where, c.Image, imageName, tag)
			}
			if len(c.Command) == 0 || !slices.Contains(shipped, c.Command[0]) {
				t.Errorf("%s: command %v, want one of %v", where, c.Command, shipped)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("%s: needs cpu and memory requests", where)
			}
			checkEnv(t, where, c, configMaps, secretKeys)
		}
	}
	if workloads < want {
		t.Errorf("%d workloads in the build, want at least %d", workloads, want)
	}
	// The evaluator is wired: the same pods with privilege escalation
	// allowed are rejected.
	for _, obj := range objs {
		if _, tmpl := podTemplate(obj); tmpl != nil {
			bad := tmpl.DeepCopy()
			bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
			if !strings.Contains(restricted(bad), "allowPrivilegeEscalation") {
				t.Errorf("the restricted check did not catch allowPrivilegeEscalation unset")
			}
			break
		}
	}
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return m, nil
}

// exampleSecretKeys are the keys of the documented Secret.
func exampleSecretKeys(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kubeDir, "secret.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := decodeStrict(b)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := obj.(*corev1.Secret)
	if !ok || s.Name != "pelguard" {
		t.Fatalf("secret.example.yaml: %T", obj)
	}
	keys := map[string]bool{}
	for k := range s.StringData {
		keys[k] = true
	}
	return keys
}

func checkEnv(t *testing.T, where string, c corev1.Container, configMaps, secretKeys map[string]bool) {
	t.Helper()
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil || !configMaps[from.ConfigMapRef.Name] {
			t.Errorf("%s: envFrom %+v is not a ConfigMap of the build", where, from)
		}
	}
	for _, e := range c.Env {
		ref := e.ValueFrom
		if ref == nil || ref.SecretKeyRef == nil {
			continue
		}
		if ref.SecretKeyRef.Name != "pelguard" || !secretKeys[ref.SecretKeyRef.Key] {
			t.Errorf("%s: %s from Secret %s key %s, which secret.example.yaml does not have", where, e.Name, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key)
		}
		// Slack is optional (alerts go to the log without it): a Secret
		// without its key must not keep the pod from starting.
		if opt := ref.SecretKeyRef.Optional; strings.HasPrefix(e.Name, "SLACK_") && (opt == nil || !*opt) {
			t.Errorf("%s: %s from the Secret must be optional: true (Slack is optional)", where, e.Name)
		}
	}
}

// The optional PodMonitor composes with the base and the webhook component
// (an overlay with both builds), and scrapes a port every Deployment
// exposes, the webhook's included, on pods it selects; the prometheus.io
// annotations name the same port.
func TestPodMonitorComponent(t *testing.T) {
	t.Parallel()
	objs := build(t, overlay(t, components))
	var pm *monitoringv1.PodMonitor
	for _, obj := range objs {
		if o, ok := obj.(*monitoringv1.PodMonitor); ok {
			pm = o
		}
	}
	if pm == nil || len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil {
		t.Fatalf("no PodMonitor with one named port in the overlay: %+v", pm)
	}
	port := *pm.Spec.PodMetricsEndpoints[0].Port
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	deployments := 0
	for _, obj := range objs {
		d, ok := obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		deployments++
		tmpl := d.Spec.Template
		if !sel.Matches(labels.Set(tmpl.Labels)) {
			t.Errorf("PodMonitor does not select Deployment %s (labels %v)", d.Name, tmpl.Labels)
		}
		var number int32
		for _, p := range tmpl.Spec.Containers[0].Ports {
			if p.Name == port {
				number = p.ContainerPort
			}
		}
		if number == 0 {
			t.Errorf("Deployment %s has no port %q", d.Name, port)
		}
		if a := tmpl.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != fmt.Sprint(number) || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("Deployment %s: prometheus.io annotations %v, want scrape on %d /metrics", d.Name, a, number)
		}
	}
	if deployments != 4 {
		t.Errorf("%d Deployments in the overlay, want the consumer, reaper, auditor and webhook", deployments)
	}
}
