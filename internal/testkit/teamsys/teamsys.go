// Package teamsys runs "the team's system" in tests: the seed article's own
// Python billing consumer and its naive XAUTOCLAIM monitor, as separate
// processes, against real Redis, real Postgres and pelguard's Stripe
// emulator (internal/stripesim). Tests that switch a team to pelguard, or
// replace the team's monitor with pelguard's reaper, build on it.
//
// The Python lives in py/ and is embedded: billing.py and team_consumer.py are
// the article's code verbatim (the few marked lines read names from the
// environment), team_monitor.py is the monitor the article describes without
// printing, and harness.py configures stripe-python and injects faults around
// the article's code without editing it.
//
// A test starts with Setup, which gives it a stream, a consumer group, a
// Postgres schema holding the team's billing_records and an emulator of its
// own:
//
//	env := teamsys.Setup(t)
//	env.Publish(t, ev)
//	c := env.Start(t, teamsys.Config{Role: teamsys.RoleConsumer})
//	testenv.Eventually(t, 30*time.Second, func() bool { return len(env.Rows(t)) == 1 }, "billed")
//
// The team's stream format is pelguard's (package event): one field
// "payload" holding {"customer_id","stripe_customer_id","amount_cents",
// "billing_period","currency"}, so one stream can feed both systems. The
// team's idempotency key is event.IdempotencyKey under IdempotencyNamespace.
package teamsys

import (
	"context"
	"embed"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Python is the interpreter the team's code runs on: Debian's, whose
// python3-redis, python3-psycopg2 and python3-stripe packages the code
// imports. A python3 earlier on PATH (pyenv) lacks them.
const Python = "/usr/bin/python3"

// Packages are the Debian packages the team's code needs.
var Packages = []string{"python3-redis", "python3-psycopg2", "python3-stripe"}

// IdempotencyNamespace is the suffix of the team's content-hash key,
// sha256(f"{customer_id}:{billing_period}:redis-streams-billing")[:32]:
// event.IdempotencyKey(customerID, period, IdempotencyNamespace) is the same
// key, so pelguard configured with this namespace replays the team's charges.
const IdempotencyNamespace = "redis-streams-billing"

//go:embed py/*.py
var pyFiles embed.FS

// python is the outcome of the one check (and install) per test binary.
var python struct {
	once     sync.Once
	versions string // "stripe 5.0.0, redis 4.3.4, psycopg2 2.9.5 ..." when usable
	problem  string // why not, when not
}

// Require skips the test unless Python with the team's modules is available,
// installing Debian's packages once (as root) when they are missing. Under
// CI=true a missing interpreter or module fails the test instead: CI must
// never pass by skipping the team's system.
func Require(t testing.TB) {
	t.Helper()
	python.once.Do(checkPython)
	if python.problem == "" {
		return
	}
	fatal, msg := unavailable(python.problem, os.Getenv("CI") == "true")
	if fatal {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// unavailable is Require's verdict when Python is not usable: fail under CI,
// else skip, with a message that says how to install what is missing.
func unavailable(problem string, ci bool) (fatal bool, msg string) {
	msg = "the team's system needs " + Python + " with modules redis, psycopg2 and stripe: " + problem +
		"; install them with: apt-get install -y " + strings.Join(Packages, " ")
	if ci {
		return true, "CI=true, so not skipping: " + msg
	}
	return false, msg
}

// probe imports the modules and prints their versions.
const probe = `import sys, redis, psycopg2, stripe, stripe.version
print("python %s, redis-py %s, psycopg2 %s, stripe-python %s" % (sys.version.split()[0],
      redis.__version__, psycopg2.__version__.split()[0], stripe.version.VERSION))`

func checkPython() {
	out, err := probePython()
	if err == nil {
		python.versions = out
		return
	}
	first := err
	if os.Geteuid() != 0 {
		python.problem = fmt.Sprintf("%v (not root, so no apt-get install was tried)", first)
		return
	}
	if inst := aptInstall(); inst != nil {
		python.problem = fmt.Sprintf("%v; apt-get install failed: %v", first, inst)
		return
	}
	if out, err = probePython(); err != nil {
		python.problem = fmt.Sprintf("%v, even after apt-get install", err)
		return
	}
	python.versions = out
}

func probePython() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, Python, "-E", "-s", "-c", probe).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", Python, err, lastLine(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// aptInstall installs Packages, running apt-get update first only when the
// plain install fails (a fresh machine has no package lists).
func aptInstall() error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("no apt-get: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	apt := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w: %s", args[0], err, lastLine(out))
		}
		return nil
	}
	install := append([]string{"install", "-y", "-qq"}, Packages...)
	if apt(install...) == nil {
		return nil
	}
	if err := apt("update", "-qq"); err != nil {
		return err
	}
	return apt(install...)
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
