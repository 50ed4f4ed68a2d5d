package validate

import (
	"bufio"
	"debug/elf"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

const repoRoot = "../.."

// staticBuilds runs the builds of the static binaries (make install, make
// release, the Dockerfile's build command) one at a time: they compile the
// same packages with the same flags, so the first fills the build cache and
// the others only link. Run at once on a fresh machine, each compiled every
// package itself.
var staticBuilds sync.Mutex

// imageBinaries are the files the image has in /usr/local/bin.
var imageBinaries = []string{"pelguard-auditor", "pelguard-console", "pelguard-consumer", "pelguard-reaper"}

type instruction struct {
	cmd  string // upper case: FROM, RUN, …
	args string
}

// dockerfile returns the Dockerfile's instructions, continuation lines
// joined and comments dropped, split into stages at each FROM.
func dockerfile(t *testing.T) [][]instruction {
	t.Helper()
	stages := dockerfileStages(t, "Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a builder and a final stage", len(stages))
	}
	return stages
}

// dockerfileStages parses the named Dockerfile of the repository root.
func dockerfileStages(t *testing.T, name string) [][]instruction {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages [][]instruction
	var global []instruction
	sc := bufio.NewScanner(f)
	cur := ""
	flush := func() {
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur), " ")
		cur = ""
		if cmd == "" {
			return
		}
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		switch {
		case in.cmd == "FROM":
			stages = append(stages, []instruction{in})
		case len(stages) == 0:
			global = append(global, in)
		default:
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			cur += more + " "
			continue
		}
		cur += line
		flush()
	}
	if len(stages) == 0 {
		t.Fatalf("%s: no FROM", name)
	}
	stages[0] = append(global, stages[0]...)
	return stages
}

// The image is built as the issue asks: Go from go.mod's version, static
// (CGO_ENABLED=0), -trimpath, the version stamped by -ldflags -X, a minimal
// final stage (distroless static or scratch) running as a numeric non-root
// user, without the build context's .git.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	stages := dockerfile(t)
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	var args []string
	for _, in := range stages[0] {
		if in.cmd == "ARG" {
			args = append(args, in.args)
		}
	}
	if goVersion == nil || !slices.Contains(args, "GO_VERSION="+string(goVersion[1])) {
		t.Errorf("Dockerfile ARG GO_VERSION must be go.mod's %s; ARGs %v", goVersion, args)
	}
	build := buildCommand(t, stages[0])
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X github.com/pelguard/pelguard/internal/version.Version=${VERSION}"} {
		if !strings.Contains(build, want) {
			t.Errorf("Dockerfile build command lacks %s: %s", want, build)
		}
	}
	final := stages[len(stages)-1]
	base := strings.Fields(final[0].args)[0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") && base != "scratch" {
		t.Errorf("final stage FROM %s, want gcr.io/distroless/static… or scratch", base)
	}
	user := ""
	for _, in := range final {
		if in.cmd == "USER" {
			user = in.args
		}
	}
	if !regexp.MustCompile(`^[1-9][0-9]*(:[1-9][0-9]*)?$`).MatchString(user) {
		t.Errorf("final stage USER %q, want a numeric non-root uid (runAsNonRoot cannot check a name)", user)
	}
	checkBases(t, "Dockerfile", stages)
	ignore := dockerignore(t)
	if ok, _ := ignore.MatchesOrParentMatches(".git"); !ok {
		t.Error(".dockerignore must exclude .git")
	}
}

// checkBases fails on a base image named by a short name (golang:1.26):
// podman refuses those unless registries.conf aliases them, so every FROM
// names its registry (docker.io/library/golang), scratch, or a stage.
func checkBases(t *testing.T, name string, stages [][]instruction) {
	t.Helper()
	var stageNames []string
	for _, st := range stages {
		for _, in := range st {
			if in.cmd != "FROM" {
				continue
			}
			f := strings.Fields(in.args)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			if len(f) == 0 {
				t.Errorf("%s: FROM %q names no image", name, in.args)
				continue
			}
			base := f[0]
			registry, _, qualified := strings.Cut(base, "/")
			qualified = qualified && (strings.ContainsAny(registry, ".:") || registry == "localhost")
			if base != "scratch" && !slices.Contains(stageNames, base) && !qualified {
				t.Errorf("%s: FROM %s is a short name; podman cannot resolve it: name the registry (docker.io/library/…)", name, base)
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				stageNames = append(stageNames, f[2])
			}
		}
	}
}

// Dockerfile.prebuilt (make image-local) packs binaries built here: FROM
// scratch and nothing else, so it never needs a registry; the same numeric
// user as the Dockerfile's image, named in the etc/passwd make image-local
// writes, and the CA bundle the binaries need for Stripe's TLS.
func TestDockerfilePrebuilt(t *testing.T) {
	t.Parallel()
	stages := dockerfileStages(t, "Dockerfile.prebuilt")
	if len(stages) != 1 || stages[0][0].args != "scratch" {
		t.Fatalf("Dockerfile.prebuilt: %d stages from %q, want one, FROM scratch", len(stages), stages[0][0].args)
	}
	checkBases(t, "Dockerfile.prebuilt", stages)
	user := ""
	var copies []string
	for _, in := range stages[0] {
		switch in.cmd {
		case "USER":
			user = in.args
		case "COPY", "ADD":
			copies = append(copies, in.args)
		case "RUN":
			t.Errorf("Dockerfile.prebuilt: RUN %s: scratch has no shell", in.args)
		}
	}
	if user != "65532:65532" {
		t.Errorf("Dockerfile.prebuilt: USER %q, want 65532:65532 (the manifests' runAsUser)", user)
	}
	makefile, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nonroot:x:65532:65532:", "/etc/ssl/certs/ca-certificates.crt", "-f Dockerfile.prebuilt"} {
		if !strings.Contains(string(makefile), want) {
			t.Errorf("Makefile's image-local lacks %q", want)
		}
	}
	if !slices.Contains(copies, "etc/ /etc/") || !slices.Contains(copies, "usr/ /usr/") {
		t.Errorf("Dockerfile.prebuilt copies %v, want etc/ and usr/ of the root make image-local assembles", copies)
	}
}

// With no container builder on PATH, `make image` and `make image-local`
// build nothing: they say how to get a builder and fail, so that a script
// or CI running them never takes "exit 0" for an image; SKIP_IMAGE=1 lets
// them go on, saying no image was built.
func TestMakeImageWithoutBuilder(t *testing.T) {
	t.Parallel()
	makePath, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make")
	}
	goPath, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"image", "image-local", "image-dockerfile"} {
		for _, skip := range []bool{false, true} {
			args := []string{"-C", repoRoot, target, "GO=" + goPath, "VERSION=0.0.0-validate"}
			if skip {
				args = append(args, "SKIP_IMAGE=1")
			}
			cmd := exec.Command(makePath, args...)
			// An empty PATH: no docker, podman or buildah (the recipes use
			// /bin/sh builtins, and go by its full path).
			cmd.Env = append(os.Environ(), "PATH="+t.TempDir())
			out, err := cmd.CombinedOutput()
			switch {
			case !skip && err == nil:
				t.Errorf("make %s without a builder exited 0:\n%s", target, out)
			case !skip && !strings.Contains(string(out), "SKIP_IMAGE=1"):
				t.Errorf("make %s without a builder does not say how to go on without one:\n%s", target, out)
			case skip && err != nil:
				t.Errorf("make %s SKIP_IMAGE=1 without a builder: %v\n%s", target, err, out)
			case skip && !strings.Contains(string(out), "no image built"):
				t.Errorf("make %s SKIP_IMAGE=1 does not say no image was built:\n%s", target, out)
			}
		}
	}
}

// buildCommand is the builder stage's RUN that runs go build, without its
// --mount options.
func buildCommand(t *testing.T, stage []instruction) string {
	t.Helper()
	for _, in := range stage {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			cmd := in.args
			for strings.HasPrefix(cmd, "--") {
				_, cmd, _ = strings.Cut(cmd, " ")
				cmd = strings.TrimSpace(cmd)
			}
			return cmd
		}
	}
	t.Fatal("Dockerfile: no RUN with go build in the first stage")
	return ""
}

func dockerignore(t *testing.T) *patternmatcher.PatternMatcher {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

// Where no container builder runs, the Dockerfile's own build command runs
// on the build context .dockerignore leaves: it must build the three
// binaries, static, under their pelguard- names, from that context alone.
func TestDockerfileBuildCommand(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds three binaries")
	}
	ctxDir, out := t.TempDir(), t.TempDir()
	copyContext(t, dockerignore(t), ctxDir)
	cmd := buildCommand(t, dockerfile(t)[0])
	// The builder writes to /out/ in its own filesystem; here, to a temp dir.
	cmd = strings.ReplaceAll(cmd, "/out/", out+"/")
	sh := exec.Command("sh", "-ec", cmd)
	sh.Dir = ctxDir
	sh.Env = append(os.Environ(), "TARGETOS="+runtime.GOOS, "TARGETARCH="+runtime.GOARCH, "VERSION=0.0.0-validate")
	staticBuilds.Lock()
	b, err := sh.CombinedOutput()
	staticBuilds.Unlock()
	if err != nil {
		t.Fatalf("the Dockerfile's build command on its context: %v\n%s\n%s", err, cmd, b)
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, imageBinaries) {
		t.Fatalf("the build makes %v, want %v", names, imageBinaries)
	}
	for _, n := range names {
		p := filepath.Join(out, n)
		checkStatic(t, p)
		if b, err := exec.Command(p, "--help").CombinedOutput(); err != nil {
			t.Errorf("%s --help: %v\n%s", n, err, b)
		}
		// --version arrives with internal/version; until then, say so.
		if b, err := exec.Command(p, "--version").CombinedOutput(); err != nil {
			t.Logf("%s --version: %v (no version flag yet?)", n, err)
		} else if !strings.Contains(string(b), "0.0.0-validate") {
			t.Errorf("%s --version does not print the -ldflags version: %s", n, b)
		}
	}
}

// `make install` puts the same static binaries, under the same names, into
// $(PREFIX)/bin; `make image-local` packs them into an image that has the
// CA bundle, the user 65532 in etc/passwd, and each binary, which runs as
// that user.
func TestMakeInstall(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: builds three binaries")
	}
	prefix := t.TempDir()
	staticBuilds.Lock()
	out, err := exec.Command("make", "-C", repoRoot, "install", "PREFIX="+prefix, "VERSION=0.0.0-validate").CombinedOutput()
	staticBuilds.Unlock()
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	entries, _ := os.ReadDir(filepath.Join(prefix, "bin"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		checkStatic(t, filepath.Join(prefix, "bin", e.Name()))
	}
	if !slices.Equal(names, imageBinaries) {
		t.Errorf("make install made %v, want %v", names, imageBinaries)
	}
	// `make image-local` packs binaries built here into an image FROM
	// scratch (Dockerfile.prebuilt): nothing is pulled, so it builds
	// wherever a builder runs. It packs these (BINDIR), not a second build.
	t.Run("image-local", func(t *testing.T) {
		b := builder()
		if b == "" {
			t.Skip("no container builder here (no Docker engine answering `docker info`, no podman, no buildah): make image-local is not tested")
		}
		const image, tag = "localhost/pelguard-validate-local", "test"
		make := exec.Command("make", "-C", repoRoot, "image-local", "IMAGE="+image, "VERSION="+tag, "BINDIR="+filepath.Join(prefix, "bin"))
		if out, err := make.CombinedOutput(); err != nil {
			t.Fatalf("make image-local: %v\n%s", err, out)
		}
		checkImage(t, b, image+":"+tag)
	})
}

// checkStatic fails unless p is an ELF executable without a dynamic loader.
func checkStatic(t *testing.T, p string) {
	t.Helper()
	f, err := elf.Open(p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked", p)
		}
	}
}

// copyContext copies the repository minus what .dockerignore excludes.
func copyContext(t *testing.T, ignore *patternmatcher.PatternMatcher, dst string) {
	t.Helper()
	err := filepath.WalkDir(repoRoot, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		if rel == "." {
			return nil
		}
		if skip, err := ignore.MatchesOrParentMatches(filepath.ToSlash(rel)); err != nil || skip {
			if d.IsDir() && !ignore.Exclusions() {
				return filepath.SkipDir
			}
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return copyFile(p, target)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// builder is the container builder `make image` would use, or "".
func builder() string {
	if exec.Command("docker", "info").Run() == nil {
		return "docker"
	}
	for _, b := range []string{"podman", "buildah"} {
		if _, err := exec.LookPath(b); err == nil {
			return b
		}
	}
	return ""
}

// registryReachable reports whether the registries the Dockerfile pulls
// from answer at all (any HTTP status: 401 is the usual one).
func registryReachable() error {
	c := &http.Client{Timeout: 5 * time.Second}
	for _, u := range []string{"https://registry-1.docker.io/v2/", "https://gcr.io/v2/"} {
		resp, err := c.Get(u)
		if err != nil {
			return err
		}
		resp.Body.Close()
	}
	return nil
}

// Where docker, podman or buildah works and docker.io and gcr.io answer,
// `make image` builds the Dockerfile's image and it runs each binary as a
// non-root user. Without a registry the test skips, saying how to build
// an image anyway: a machine that has podman but no route to a registry
// is not a failed check (TestMakeInstall/image-local builds the registry-free image).
func TestImageBuild(t *testing.T) {
	t.Parallel()
	b := builder()
	if b == "" {
		t.Skip("no container builder here (no Docker engine answering `docker info`, no podman, no buildah): " +
			"the image build is not tested; TestDockerfileBuildCommand ran its build command instead")
	}
	if err := registryReachable(); err != nil {
		t.Skipf("no registry reachable (%v): the Dockerfile's image (docker.io golang, gcr.io distroless) is not built here; "+
			"build it where one is (make image-dockerfile), or pack binaries built here with `make image` (FROM scratch)", err)
	}
	const image, tag = "localhost/pelguard-validate", "test"
	make := exec.Command("make", "-C", repoRoot, "image-dockerfile", "IMAGE="+image, "VERSION="+tag)
	if out, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make image-dockerfile: %v\n%s", err, out)
	}
	checkImage(t, b, image+":"+tag)
}

// checkImage checks the image's user and its files, and runs each binary
// in it where this machine can run containers.
func checkImage(t *testing.T, b, ref string) {
	t.Helper()
	if b == "buildah" {
		return
	}
	t.Cleanup(func() { _ = exec.Command(b, "rmi", ref).Run() })
	user, err := exec.Command(b, "image", "inspect", "-f", "{{.Config.User}}", ref).Output()
	if err != nil || strings.TrimSpace(string(user)) != "65532:65532" {
		t.Errorf("image user %q (%v), want 65532:65532", user, err)
	}
	// The files, from the image itself (create, not run: no runtime needed),
	// and its binaries run here: a machine that cannot run containers
	// still checks what the image holds.
	id, err := exec.Command(b, "create", ref).Output()
	if err != nil {
		t.Fatalf("%s create %s: %v", b, ref, err)
	}
	t.Cleanup(func() { _ = exec.Command(b, "rm", strings.TrimSpace(string(id))).Run() })
	root := t.TempDir()
	export := b + " export " + strings.TrimSpace(string(id)) + " | tar -x -C " + root
	if out, err := exec.Command("sh", "-c", export).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", export, err, out)
	}
	for _, want := range []string{"etc/ssl/certs/ca-certificates.crt", "etc/passwd"} {
		if _, err := os.Stat(filepath.Join(root, want)); err != nil {
			t.Errorf("the image lacks /%s: %v", want, err)
		}
	}
	for _, bin := range imageBinaries {
		p := filepath.Join(root, "usr/local/bin", bin)
		checkStatic(t, p)
		if out, err := exec.Command(p, "--help").CombinedOutput(); err != nil {
			t.Errorf("the image's %s --help: %v\n%s", bin, err, out)
		}
	}
	for i, bin := range imageBinaries {
		out, err := exec.Command(b, "run", "--rm", ref, bin, "--help").CombinedOutput()
		if i == 0 && err != nil && strings.Contains(string(out), "OCI permission denied") {
			// The runtime may not start containers here (a sandbox that
			// forbids its setrlimit): the machine, not the image.
			t.Logf("%s cannot start containers here; the binaries ran from the exported image instead: %s", b, out)
			return
		}
		if err != nil {
			t.Errorf("%s run %s --help: %v\n%s", b, bin, err, out)
		}
	}
}
