package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseClusterURL(t *testing.T) {
	t.Parallel()
	opt, err := ParseClusterURL("redis+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2:7001, 10.0.0.3:7002/?dial_timeout=3&max_redirects=5")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(opt.Addrs, ","); got != "10.0.0.1:7000,10.0.0.2:7001,10.0.0.3:7002" {
		t.Errorf("Addrs = %s", got)
	}
	if opt.Username != "app" || opt.Password != "s3cret" || opt.DialTimeout != 3*time.Second || opt.MaxRedirects != 5 || opt.TLSConfig != nil {
		t.Errorf("options = %+v", opt)
	}
	opt, err = ParseClusterURL("rediss+cluster://:pw@h:1")
	if err != nil {
		t.Fatal(err)
	}
	if opt.TLSConfig == nil || opt.TLSConfig.ServerName != "h" || opt.Password != "pw" || len(opt.Addrs) != 1 {
		t.Errorf("TLS options = %+v", opt)
	}
	for _, bad := range []string{
		"redis+cluster:///",                      // no seeds
		"redis+cluster://h1:1,h2/",               // seed without port
		"redis+cluster://h1:1/3",                 // database 3
		"redis+cluster://h1:1/?addr=h2:2",        // seeds belong in the host part
		"redis+cluster://h1:1/?no_such_option=1", // go-redis refuses unknown options
		"redis://h1:1/0",                         // not a cluster URL
	} {
		if _, err := ParseClusterURL(bad); err == nil {
			t.Errorf("ParseClusterURL(%q) accepted", bad)
		}
	}
}

func TestNewRedisClientKinds(t *testing.T) {
	t.Parallel()
	c, addr, _, err := newRedisClient("redis+cluster://127.0.0.1:1,127.0.0.1:2/")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*redis.ClusterClient); !ok || addr != "127.0.0.1:1,127.0.0.1:2" {
		t.Errorf("got %T at %s, want a cluster client", c, addr)
	}
	s, addr, _, err := newRedisClient("redis://127.0.0.1:6379/2")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*redis.Client); !ok || addr != "127.0.0.1:6379" {
		t.Errorf("got %T at %s, want a single-node client", s, addr)
	}
}

func TestOpenRedisClusterUsageError(t *testing.T) {
	t.Parallel()
	_, err := OpenRedis(context.Background(), "redis+cluster://app:hunter2@h1:1/7")
	var ue *UsageError
	if err == nil || !errors.As(err, &ue) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v, want a usage error without the password", err)
	}
}
