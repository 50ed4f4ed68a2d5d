package validate

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// switchingSettings are step 5 of the README's "Switching from an existing
// consumer" (--namespace redis-streams-billing --stripe-mode charges
// --charge-metadata=false, the article's description) as the environment
// the binaries read.
var switchingSettings = map[string]string{
	"PELGUARD_NAMESPACE":          "redis-streams-billing",
	"STRIPE_MODE":                 "charges",
	"PELGUARD_CHARGE_METADATA":    "false",
	"PELGUARD_CHARGE_DESCRIPTION": "Usage billing for {period}",
}

// cliEnv is every environment variable internal/cli reads: Env("X", …),
// EnvBool, EnvDuration, EnvInt, and the "[X]" every flag's help names it
// by (secrets such as SLACK_WEBHOOK_URL are read by flag name).
func cliEnv(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "internal/cli/*.go"))
	if err != nil {
		t.Fatal(err)
	}
	sub, _ := filepath.Glob(filepath.Join(repoRoot, "internal/cli/*/*.go"))
	re := regexp.MustCompile(`\bEnv[A-Za-z]*\("([A-Z0-9_]+)"|\[([A-Z][A-Z0-9_]+)\]"`)
	vars := map[string]bool{}
	for _, f := range append(files, sub...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			vars[string(m[1])+string(m[2])] = true
		}
	}
	if !vars["PELGUARD_NAMESPACE"] || !vars["REDIS_URL"] {
		t.Fatalf("found no Env(\"…\") calls in internal/cli: %v", vars)
	}
	return vars
}

// The switching component sets, in the ConfigMap every pod reads, the
// settings the runbook's step 5 gives as flags: a team deploying the
// shipped files after the runbook charges under its own keys and request
// shape, not under "prod" with pelguard's metadata. Every key of the
// ConfigMap, base or switching, is a variable the binaries read: a
// misspelt one would be ignored without a word.
func TestSwitchingComponent(t *testing.T) {
	t.Parallel()
	env := cliEnv(t)
	var cm *corev1.ConfigMap
	objs := build(t, overlay(t, []string{"switching"}))
	for _, obj := range objs {
		if o, ok := obj.(*corev1.ConfigMap); ok && o.Name == "pelguard" {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("no pelguard ConfigMap in the switching overlay")
	}
	for k, want := range switchingSettings {
		if got := cm.Data[k]; got != want {
			t.Errorf("switching overlay: %s=%q, want %q (the runbook's step 5)", k, got, want)
		}
	}
	for k := range cm.Data {
		if !env[k] {
			t.Errorf("the ConfigMap sets %s, which no pelguard binary reads", k)
		}
	}
	// The base stays a new deployment's: pelguard's namespace and metadata.
	for _, obj := range build(t, kubeDir) {
		if o, ok := obj.(*corev1.ConfigMap); ok && o.Name == "pelguard" && o.Data["STRIPE_MODE"] == "charges" {
			t.Errorf("the base ConfigMap is the switching one: %v", o.Data)
		}
	}
}

// The systemd env file for a switching team has the same settings, and
// every variable it sets is one the binaries read.
func TestSwitchingEnvFile(t *testing.T) {
	t.Parallel()
	env := cliEnv(t)
	for _, name := range []string{"pelguard.env.example", "pelguard-switching.env.example"} {
		vars := envFile(t, filepath.Join("../systemd", name))
		for k := range vars {
			if !env[k] {
				t.Errorf("%s sets %s, which no pelguard binary reads", name, k)
			}
		}
		if name == "pelguard.env.example" {
			continue
		}
		for k, want := range switchingSettings {
			if got := vars[k]; got != want {
				t.Errorf("%s: %s=%q, want %q (the runbook's step 5)", name, k, got, want)
			}
		}
	}
}

// envFile reads an EnvironmentFile= as systemd does for these simple
// files: KEY=VALUE lines, # comments, one level of double quotes.
func envFile(t *testing.T, p string) map[string]string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: not KEY=VALUE: %s", p, line)
			continue
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		vars[k] = v
	}
	return vars
}
