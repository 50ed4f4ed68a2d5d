// Package stripemocktest starts Stripe's official stripe-mock for tests, so
// any package can check that the requests it makes have the shapes Stripe's
// OpenAPI spec allows. It never skips: a missing stripe-mock fails the test,
// because a silently skipped conformance test proves nothing.
package stripemocktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Version is the stripe-mock release installed when none is found.
const Version = "v0.203.0"

// APIKey is a syntactically valid test key that stripe-mock accepts.
const APIKey = "sk_test_123"

var (
	installOnce sync.Once
	installPath string
	installErr  error
)

// Binary returns the path of stripe-mock: $PATH, then $(go env GOPATH)/bin,
// then `go install github.com/stripe/stripe-mock@Version` (once per process).
func Binary() (string, error) {
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p, nil
	}
	gobin, err := goBinDir()
	if err == nil {
		p := filepath.Join(gobin, "stripe-mock")
		if st, statErr := os.Stat(p); statErr == nil && !st.IsDir() {
			return p, nil
		}
	}
	installOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "install", "github.com/stripe/stripe-mock@"+Version)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			installErr = fmt.Errorf("go install stripe-mock@%s: %w: %s", Version, err, out.String())
			return
		}
		dir, err := goBinDir()
		if err != nil {
			installErr = err
			return
		}
		installPath = filepath.Join(dir, "stripe-mock")
	})
	return installPath, installErr
}

func goBinDir() (string, error) {
	if gobin := os.Getenv("GOBIN"); gobin != "" {
		return gobin, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOPATH: %w", err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), string(os.PathListSeparator))
	if first == "" {
		return "", errors.New("go env GOPATH is empty")
	}
	return filepath.Join(first, "bin"), nil
}

// Start runs a stripe-mock on a free loopback port for the life of the test
// and returns its base URL (http://127.0.0.1:PORT). It fails the test if
// stripe-mock cannot be found, installed or started, whether or not CI is set.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("stripe-mock is required for the conformance tests and could not be found or installed (CI=%q): %v", os.Getenv("CI"), err)
	}
	var lastErr error
	// A free port found by listening and closing can be taken before
	// stripe-mock binds it; a few attempts make that race harmless.
	for range 3 {
		url, err := start(t, bin)
		if err == nil {
			return url
		}
		lastErr = err
	}
	t.Fatalf("starting stripe-mock: %v", lastErr)
	return ""
}

func start(t testing.TB, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "-http-addr", addr)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("exec %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	url := "http://" + addr
	deadline := time.Now().Add(20 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			return "", fmt.Errorf("stripe-mock exited early: %s", out.String())
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, url+"/v1/charges?limit=1", nil)
		req.SetBasicAuth(APIKey, "")
		if resp, err := hc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Cleanup(stop)
				return url, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("stripe-mock did not answer on %s within 20s: %s", addr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// syncBuffer collects the child's output; the child writes from os/exec's
// copying goroutines while the test may read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
