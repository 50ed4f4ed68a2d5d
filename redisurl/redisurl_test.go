package redisurl

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The userinfo is the data node's, the sentinel_* parameters the
// sentinels': the reverse of redis.ParseFailoverURL.
func TestParseSentinelCredentials(t *testing.T) {
	t.Parallel()
	opt, err := ParseSentinel("redis+sentinel://app:data%40pw@10.0.0.1:26379, 10.0.0.2:26380,10.0.0.3:26381/2?master_name=billing&sentinel_username=sen&sentinel_password=sen%26tinel&dial_timeout=3")
	if err != nil {
		t.Fatal(err)
	}
	if opt.Username != "app" || opt.Password != "data@pw" {
		t.Errorf("data node credentials = %q %q, want app data@pw", opt.Username, opt.Password)
	}
	if opt.SentinelUsername != "sen" || opt.SentinelPassword != "sen&tinel" {
		t.Errorf("sentinel credentials = %q %q, want sen sen&tinel", opt.SentinelUsername, opt.SentinelPassword)
	}
	if got := strings.Join(opt.SentinelAddrs, ","); got != "10.0.0.1:26379,10.0.0.2:26380,10.0.0.3:26381" {
		t.Errorf("sentinels = %s", got)
	}
	if opt.MasterName != "billing" || opt.DB != 2 || opt.DialTimeout != 3*time.Second || opt.TLSConfig != nil {
		t.Errorf("options = %+v", opt)
	}
	cfg, err := Parse("rediss+sentinel://:pw@s1:1,s2:2/?master_name=m")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kind != Sentinel || cfg.Failover.TLSConfig == nil || cfg.Failover.Password != "pw" || cfg.Failover.SentinelPassword != "" {
		t.Errorf("TLS config = %+v", cfg.Failover)
	}
	if got := cfg.Addr(); got != `master "m" via sentinels s1:1,s2:2` {
		t.Errorf("Addr = %s", got)
	}
}

// Options that route to replicas or clash with the URL's forms are refused,
// naming the option; so is a URL without master_name. No error quotes a
// password.
func TestParseSentinelRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, option string }{
		{"redis+sentinel://:Secret0pw@s1:1/?master_name=m&route_by_latency=true", "route_by_latency"},
		{"redis+sentinel://:Secret0pw@s1:1/?master_name=m&route_randomly=true", "route_randomly"},
		{"redis+sentinel://:Secret0pw@s1:1/?master_name=m&replica_only=true", "replica_only"},
		{"redis+sentinel://s1:1/?master_name=m&username=app", "username"},
		{"redis+sentinel://s1:1/?master_name=m&password=Secret0pw", "password"},
		{"redis+sentinel://s1:1/?master_name=m&addr=s2:2", "addr"},
		{"redis+sentinel://:Secret0pw@s1:1,s2:2/0", "master_name"},
		{"redis+sentinel://s1:1/?master_name=&sentinel_password=Secret0pw", "master_name"},
	} {
		_, err := Parse(c.url)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Option != c.option {
			t.Errorf("Parse(%s) = %v, want an OptionError naming %s", c.url, err, c.option)
		}
		if err != nil && strings.Contains(err.Error(), "Secret0pw") {
			t.Errorf("Parse(%s) quoted the password: %v", c.url, err)
		}
	}
	for _, bad := range []string{
		"redis+sentinel:///?master_name=m",                                    // no sentinels
		"redis+sentinel://s1/?master_name=m",                                  // no port
		"redis+sentinel://s1:1/x?master_name=m",                               // database not a number
		"redis+sentinel://s1:1/?master_name=m&no_such_option=1",               // go-redis refuses unknown options
		"redis+sentinel://:Secret0pw@x@s1:1/?master_name=m",                   // an '@' in the password
		"redis+sentinel://s1:1/?master_name=m&sentinel_password=%zzSecret0pw", // a query that does not parse
	} {
		_, err := Parse(bad)
		if err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "Secret0pw") {
			t.Errorf("Parse(%q) quoted the password: %v", bad, err)
		}
	}
}

// Each TLS connection checks the certificate against the host it dials:
// go-redis's parsed configuration names the first sentinel for all of them,
// so a second sentinel whose certificate names only its own host fails the
// handshake. Two TLS servers, one with a certificate for "localhost", one
// for 127.0.0.1 only, both trusted.
func TestSentinelTLSServerNamePerHost(t *testing.T) {
	t.Parallel()
	roots, p1, p2 := twoTLSServers(t)
	opt, err := ParseSentinel("rediss+sentinel://localhost:" + p1 + ",127.0.0.1:" + p2 + "/?master_name=m")
	if err != nil {
		t.Fatal(err)
	}
	opt.TLSConfig.RootCAs = roots
	handshakeEach(t, Dialer(opt), "localhost:"+p1, "127.0.0.1:"+p2)
	// go-redis's own configuration (ServerName: the first sentinel) fails
	// the second: what the per-host dialer fixes.
	cfg := opt.TLSConfig.Clone()
	if cfg.ServerName != "localhost" {
		t.Fatalf("go-redis's ServerName = %q, want the first sentinel's", cfg.ServerName)
	}
	if c, err := tls.Dial("tcp", "127.0.0.1:"+p2, cfg); err == nil {
		c.Close()
		t.Error("the first sentinel's ServerName verified the second's certificate")
	}
}

// The same for a cluster's nodes: each verified under the host dialled,
// not the first seed's.
func TestClusterTLSServerNamePerHost(t *testing.T) {
	t.Parallel()
	roots, p1, p2 := twoTLSServers(t)
	opt, err := ParseCluster("rediss+cluster://localhost:" + p1 + ",127.0.0.1:" + p2 + "/")
	if err != nil {
		t.Fatal(err)
	}
	if opt.Dialer == nil {
		t.Fatal("a TLS cluster URL has no per-host dialer: every node would be verified as the first seed")
	}
	opt.TLSConfig.RootCAs = roots
	handshakeEach(t, opt.Dialer, "localhost:"+p1, "127.0.0.1:"+p2)
}

// twoTLSServers serves TLS handshakes on two loopback ports, one with a
// certificate for "localhost" only, one for 127.0.0.1 only; roots trusts both.
func twoTLSServers(t *testing.T) (roots *x509.CertPool, p1, p2 string) {
	t.Helper()
	roots = x509.NewCertPool()
	serve := func(name string) string {
		cert := selfSigned(t, name)
		roots.AddCert(cert.Leaf)
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
			}
		}()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		return port
	}
	return roots, serve("localhost"), serve("127.0.0.1")
}

func handshakeEach(t *testing.T, dial func(context.Context, string, string) (net.Conn, error), addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Errorf("dial %s: %v", addr, err)
			continue
		}
		if err := c.(*tls.Conn).Handshake(); err != nil {
			t.Errorf("handshake with %s: %v", addr, err)
		}
		c.Close()
	}
}

func selfSigned(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func TestParseKinds(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]Kind{
		"redis://127.0.0.1:6379/0":              Single,
		"rediss://h:1/0":                        Single,
		"redis+cluster://h1:1,h2:2/":            Cluster,
		"REDISS+CLUSTER://h1:1/":                Cluster,
		"redis+sentinel://h1:1/?master_name=m":  Sentinel,
		"rediss+sentinel://h1:1/?master_name=m": Sentinel,
	} {
		cfg, err := Parse(raw)
		if err != nil || cfg.Kind != want {
			t.Errorf("Parse(%s) = %+v, %v; want kind %d", raw, cfg, err, want)
			continue
		}
		c := cfg.NewClient()
		c.Close()
	}
	if _, ok := Primary(redis.NewClient(&redis.Options{})); ok {
		t.Error("Primary of a single-node client")
	}
}
