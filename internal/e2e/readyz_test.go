package e2e

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/internal/stripesim"
	"github.com/pelguard/pelguard/internal/testenv"
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
