package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServerMissing explains why aof-rollback cannot run here, or "".
func redisServerMissing() string {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return "redis-server is not installed, and aof-rollback needs a Redis of its own to crash " +
			"(install Debian's redis-server package; `make test` does)"
	}
	return ""
}

// redisServer is a redis-server of the drill's own in a temp dir, with the
// persistence the seed describes: appendonly yes, appendfsync everysec.
type redisServer struct {
	dir    string
	port   string
	cmd    *exec.Cmd
	client *redis.Client
	log    *slog.Logger
}

func startRedisServer(ctx context.Context, log *slog.Logger) (*redisServer, error) {
	dir, err := os.MkdirTemp("", "pelguard-chaos-redis-")
	if err != nil {
		return nil, fmt.Errorf("creating the Redis dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &redisServer{dir: dir, port: port, log: log}
	if err := s.launch(ctx); err != nil {
		s.close()
		return nil, err
	}
	s.client = redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port})
	return s, nil
}

func (s *redisServer) url() string { return "redis://127.0.0.1:" + s.port + "/0" }

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port), nil
}

func (s *redisServer) launch(ctx context.Context) error {
	s.cmd = exec.Command("redis-server", "--port", s.port, "--bind", "127.0.0.1", "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--logfile", filepath.Join(s.dir, "redis.log"))
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + s.port})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %s did not answer within 10s (see %s)", s.port, filepath.Join(s.dir, "redis.log"))
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// snapshot rewrites the AOF, so it holds the whole current state fsynced,
// and copies it aside: the state a crash will roll back to.
func (s *redisServer) snapshot(ctx context.Context) (string, error) {
	if err := s.client.BgRewriteAOF(ctx).Err(); err != nil {
		return "", fmt.Errorf("BGREWRITEAOF: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := s.client.Info(ctx, "persistence").Result()
		if err != nil {
			return "", fmt.Errorf("INFO persistence: %w", err)
		}
		if strings.Contains(info, "aof_rewrite_in_progress:0") && strings.Contains(info, "aof_rewrite_scheduled:0") &&
			strings.Contains(info, "aof_last_bgrewrite_status:ok") {
			break
		}
		if time.Now().After(deadline) {
			return "", errors.New("the AOF rewrite did not finish within 10s")
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return "", err
		}
	}
	snap := filepath.Join(s.dir, "snapshot")
	if err := os.CopyFS(filepath.Join(snap, "appendonlydir"), os.DirFS(filepath.Join(s.dir, "appendonlydir"))); err != nil {
		return "", fmt.Errorf("copying the AOF aside: %w", err)
	}
	return snap, nil
}

// crashAndRestore kills Redis without a shutdown save (a crash) and
// restarts it from the snapshot's AOF, as a failover to a replica that had
// not yet received the last second of writes would.
func (s *redisServer) crashAndRestore(ctx context.Context, snap string) error {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
	aof := filepath.Join(s.dir, "appendonlydir")
	if err := os.RemoveAll(aof); err != nil {
		return fmt.Errorf("removing the crashed AOF: %w", err)
	}
	if err := os.CopyFS(aof, os.DirFS(filepath.Join(snap, "appendonlydir"))); err != nil {
		return fmt.Errorf("restoring the AOF: %w", err)
	}
	return s.launch(ctx)
}

// close kills the server and removes its dir.
func (s *redisServer) close() {
	if s.client != nil {
		_ = s.client.Close()
	}
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	if err := os.RemoveAll(s.dir); err != nil {
		s.log.Warn("chaos: removing the Redis dir failed", slog.String("dir", s.dir), slog.Any("error", err))
	}
}
