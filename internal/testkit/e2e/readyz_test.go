package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testkit/testenv"
)

// /readyz reflects Redis reachability: 200 while the consumer's Redis runs,
// 503 once it is killed (the process stays up: /healthz still 200), 200
// again when Redis is back.
func TestReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	startRedis := func() *exec.Cmd {
		cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--dir", dir)
		if err := cmd.Start(); err != nil {
			t.Fatalf("redis-server: %v", err)
		}
		c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
		defer c.Close()
		testenv.Eventually(t, 10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }, "redis-server up")
		return cmd
	}
	rs := startRedis()
	t.Cleanup(func() { _ = rs.Process.Kill(); _ = rs.Wait() })

	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	_, dbURL := testenv.DBWithURL(t)
	env := baseEnv("DATABASE_URL="+dbURL, fmt.Sprintf("REDIS_URL=redis://127.0.0.1:%d/0", port),
		"STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	cons := startBin(t, "consumer", env, "--metrics-addr", "127.0.0.1:0", "--block", "100ms")
	base := "http://" + cons.addr()
	ready := func(want int) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() bool { code, _ := get(t, base+"/readyz"); return code == want },
			"/readyz answers %d", want)
	}
	ready(200)
	_ = rs.Process.Kill()
	_ = rs.Wait()
	ready(503)
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d while Redis is down: the process itself is fine", code)
	}
	rs = startRedis()
	ready(200)
}

// /readyz reflects Postgres reachability too. The consumer reaches the real
// Postgres through a TCP relay the test can cut: 503 naming postgres while
// it is cut (the process stays up), 200 once it is back.
func TestReadyzFollowsPostgres(t *testing.T) {
	t.Parallel()
	sim := stripesim.MustNew(stripesim.Config{})
	t.Cleanup(sim.Close)
	_, dbURL := testenv.DBWithURL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	rl := startRelay(t, "127.0.0.1:0", u.Host)
	u.Host = rl.addr
	env := baseEnv("DATABASE_URL="+u.String(), "REDIS_URL="+testenv.RedisURL(),
		"STRIPE_API_KEY="+testKey, "STRIPE_API_BASE="+sim.URL())
	cons := startBin(t, "consumer", env, "--metrics-addr", "127.0.0.1:0", "--block", "100ms",
		"--stream", testenv.Name(t, "billing"))
	base := "http://" + cons.addr()
	ready := func(want int, body string) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() bool {
			code, got := get(t, base+"/readyz")
			return code == want && strings.Contains(got, body)
		}, "/readyz answers %d %q", want, body)
	}
	ready(200, "ok")
	rl.cut()
	ready(503, "postgres: not ready")
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d while Postgres is cut off: the process itself is fine", code)
	}
	startRelay(t, rl.addr, rl.target) // Postgres is back, on the same address
	ready(200, "ok")
}

// relay forwards TCP connections from addr to target until cut, which
// closes the listener and every connection it carries: to its clients, the
// server went away.
type relay struct {
	addr, target string
	ln           net.Listener
	mu           sync.Mutex
	conns        []net.Conn
	closed       bool
}

func startRelay(t *testing.T, addr, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String(), target: target, ln: ln}
	t.Cleanup(r.cut)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			r.mu.Lock()
			if r.closed {
				r.mu.Unlock()
				_, _ = in.Close(), out.Close()
				return
			}
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return r
}

func (r *relay) cut() {
	_ = r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}
