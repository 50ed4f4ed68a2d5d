package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// helpFlags runs `bin <sub> --help` and returns the flags it lists.
func helpFlags(t *testing.T, bin string, sub []string) map[string]bool {
	t.Helper()
	res := runBin(t, bin, baseEnv(), 30*time.Second, append(sub, "--help")...)
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z0-9-]+)`).FindAllStringSubmatch(res.out, -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("%s %v --help lists no flags:\n%s", bin, sub, res.out)
	}
	return flags
}

// installedName is the name `make install` and the image give the binary
// that `go build ./cmd/<bin>` names bin.
func installedName(bin string) string { return "pelguard-" + bin }

// checkCommand checks that argv[0] is an installed pelguard binary under
// /usr/local/bin and that every --flag of the command line exists on it
// (asking the subcommand's own --help).
func checkCommand(t *testing.T, where string, argv []string) {
	t.Helper()
	bin, ok := strings.CutPrefix(filepath.Base(argv[0]), "pelguard-")
	if _, known := bins[bin]; !ok || !known || argv[0] != "/usr/local/bin/"+installedName(bin) {
		t.Errorf("%s: %q is not /usr/local/bin/pelguard-{consumer,reaper,auditor}", where, argv[0])
		return
	}
	var sub []string
	for _, a := range argv[1:] {
		if strings.HasPrefix(a, "-") {
			break
		}
		sub = append(sub, a)
	}
	flags := helpFlags(t, bin, sub)
	for _, a := range argv[1:] {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !flags[name] {
			t.Errorf("%s: %s has no flag --%s", where, bin, name)
		}
	}
}

// yamlLine is the strict shape every manifest line must have: blank, a
// comment, `key:`, `key: value`, `- item` or `- key: value`, indented by
// spaces in steps of two.
var yamlLine = regexp.MustCompile(`^(  )*(#.*|- .+|[A-Za-z0-9_./-]+:( .+)?)$`)

// The Kubernetes manifests parse (strictly, with the subset of YAML they
// use), their containers run real binaries with real flags, probes use
// /healthz and /readyz on the --metrics-addr port, every container has
// resource requests and takes secrets from a Secret.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	if len(files) < 5 {
		t.Fatalf("manifests: %v", files)
	}
	inline := regexp.MustCompile(`^\s*(command|args): \[(.*)\]$`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		var argv []string
		var inArgs, inProbe bool
		var argsIndent int
		var probePaths, probePorts []string
		kind := ""
		for i, l := range lines {
			if l == "" {
				continue
			}
			if strings.Contains(l, "\t") || !yamlLine.MatchString(l) {
				t.Errorf("%s:%d: not the YAML subset manifests use: %q", f, i+1, l)
			}
			trim := strings.TrimSpace(l)
			indent := len(l) - len(strings.TrimLeft(l, " "))
			if strings.HasPrefix(trim, "#") {
				continue
			}
			if v, ok := strings.CutPrefix(l, "kind: "); ok {
				kind = v
			}
			if inArgs {
				if item, ok := strings.CutPrefix(trim, "- "); ok && indent >= argsIndent {
					argv = append(argv, strings.Trim(item, `"`))
					continue
				}
				inArgs = false
			}
			if m := inline.FindStringSubmatch(l); m != nil {
				for _, it := range strings.Split(m[2], ",") {
					argv = append(argv, strings.Trim(strings.TrimSpace(it), `"`))
				}
				continue
			}
			if trim == "args:" {
				inArgs, argsIndent = true, indent
				continue
			}
			if trim == "livenessProbe:" || trim == "readinessProbe:" {
				inProbe = true
			}
			if inProbe {
				if v, ok := strings.CutPrefix(trim, "path: "); ok {
					probePaths = append(probePaths, v)
				}
				if v, ok := strings.CutPrefix(trim, "port: "); ok {
					probePorts = append(probePorts, v)
					inProbe = false
				}
			}
		}
		switch kind {
		case "Deployment", "Job", "CronJob":
		default:
			continue
		}
		if len(argv) == 0 {
			t.Errorf("%s: no command", f)
			continue
		}
		checkCommand(t, f, argv)
		text := string(b)
		if !strings.Contains(text, "requests:") || !strings.Contains(text, "secretKeyRef:") {
			t.Errorf("%s: containers need resource requests and secrets from a Secret", f)
		}
		if kind != "Deployment" {
			continue
		}
		port := ""
		for _, a := range argv {
			if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
				if !strings.HasPrefix(v, "0.0.0.0:") {
					t.Errorf("%s: --metrics-addr %s: probes need the pod IP", f, v)
				}
				port = strings.TrimPrefix(v, "0.0.0.0:")
			}
		}
		if strings.Join(probePaths, ",") != "/healthz,/readyz" {
			t.Errorf("%s: probe paths %v, want /healthz then /readyz", f, probePaths)
		}
		for _, p := range probePorts {
			if p != port {
				t.Errorf("%s: probe port %s, --metrics-addr port %q", f, p, port)
			}
		}
	}
}

// The systemd units run real binaries with real flags.
func TestSystemdUnits(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob(filepath.Join(deployDir, "systemd", "*.service"))
	if len(files) < 4 {
		t.Fatalf("units: %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for line := range strings.SplitSeq(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "ExecStart=")
			if !ok {
				continue
			}
			n++
			argv := splitUnitArgs(v)
			checkCommand(t, f, argv)
		}
		if n != 1 {
			t.Errorf("%s: %d ExecStart lines", f, n)
		}
	}
}

// splitUnitArgs splits an ExecStart value the way systemd does for the
// forms the units use: whitespace, and double quotes around a whole word.
func splitUnitArgs(s string) []string {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			out = append(out, s[1:end+1])
			s = s[end+2:]
			continue
		}
		word, rest, _ := strings.Cut(s, " ")
		out = append(out, word)
		s = rest
	}
	return out
}
