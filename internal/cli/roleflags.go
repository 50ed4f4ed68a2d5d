package cli

import (
	"flag"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/stripelimit"
)

// RoleFlags are the flags every long-running role (`consumer run`,
// `consumer meter-events`, `reaper run`) repeats: where Redis and Postgres
// are, the schema, the streams, the metrics address, the start-up wait,
// the pool size, logging, Stripe and Slack. A role's options embed it,
// register it with Register, check it with CheckSchema first and
// Validate last, and BuildRole
// builds from Role: the same names, defaults and help for every role.
type RoleFlags struct {
	RedisURL, DatabaseURL string
	Schema                string
	Streams               Streams
	Group                 string
	MetricsAddr           string
	WaitForDeps           time.Duration
	MaxDBConns            int
	Log                   Logging
	Stripe                Stripe
	Slack                 Slack
}

// RoleFlagSpec is what differs between the roles' shared flags.
type RoleFlagSpec struct {
	// StreamsVerb ends "stream to …" in --stream's help.
	StreamsVerb string
	// MetricsEnv and MetricsDefault: --metrics-addr's variable and default.
	MetricsEnv, MetricsDefault string
}

// Specs of the roles' shared flags.
var (
	// ConsumerMetrics: the consumers' (and the webhook's) metrics address.
	ConsumerMetrics = RoleFlagSpec{MetricsEnv: "PELGUARD_METRICS_ADDR", MetricsDefault: "127.0.0.1:9464"}
	// ReaperMetrics: the reaper's, beside a consumer on one host.
	ReaperMetrics = RoleFlagSpec{MetricsEnv: "PELGUARD_REAPER_METRICS_ADDR", MetricsDefault: "127.0.0.1:9465"}
)

// Verb is s with StreamsVerb set.
func (s RoleFlagSpec) Verb(v string) RoleFlagSpec { s.StreamsVerb = v; return s }

// Register adds the shared flags.
func (f *RoleFlags) Register(fs *flag.FlagSet, spec RoleFlagSpec) {
	RegisterRedis(fs, &f.RedisURL)
	RegisterDatabase(fs, &f.DatabaseURL)
	RegisterSchema(fs, &f.Schema)
	RegisterStreams(fs, &f.Streams, &f.Group, spec.StreamsVerb)
	RegisterMetricsAddr(fs, &f.MetricsAddr, spec.MetricsEnv, spec.MetricsDefault)
	RegisterWait(fs, &f.WaitForDeps)
	RegisterMaxDBConns(fs, &f.MaxDBConns)
	f.Log.Register(fs)
	f.Stripe.Register(fs)
	f.Slack.Register(fs)
}

// CheckSchema checks --db-schema against --database-url: a role's first
// check.
func (f *RoleFlags) CheckSchema() error { return CheckSchemaFlag(f.DatabaseURL, f.Schema) }

// Validate checks the rest of the shared flags that need no connection:
// logging, Stripe when the role calls it (its key's shape, not its rights)
// and --wait-for-deps. A role calls it after its own checks, so a bad flag
// of its own is named before a missing Stripe key. The streams are
// resolved by each role (the reaper's may be meter streams alone).
func (f *RoleFlags) Validate(stripe bool) error {
	if err := f.Log.Validate(); err != nil {
		return err
	}
	if stripe {
		if err := f.Stripe.Validate(); err != nil {
			return err
		}
	}
	return ValidateWait(f.WaitForDeps)
}

// Role is what BuildRole builds from the shared flags: metrics names the
// registry, witness the ledger witness's role, name the process's name;
// withStripe false leaves the Stripe client out (a dry run).
func (f *RoleFlags) Role(metrics, witness, name string, withStripe bool, share stripelimit.Role, conns int32) Role {
	r := Role{Metrics: metrics, Witness: witness, Name: name, Schema: f.Schema, RedisURL: f.RedisURL, DBURL: f.DatabaseURL,
		Log: f.Log, Slack: f.Slack, Share: share, Conns: conns}
	if withStripe {
		r.Stripe = &f.Stripe
	}
	return r
}

// RegisterMetricsAddr adds --metrics-addr, read from env by default.
func RegisterMetricsAddr(fs *flag.FlagSet, dst *string, env, def string) {
	fs.StringVar(dst, "metrics-addr", Env(env, def), "address of /metrics, /healthz, /readyz (empty: off) ["+env+"]")
}

// RegisterNamespace adds --namespace, the part of every idempotency key
// and meter-event identifier each role of a stream must agree on
// (default $PELGUARD_NAMESPACE or pelguard); help says what it is for this
// command.
func RegisterNamespace(fs *flag.FlagSet, dst *string, help string) {
	fs.StringVar(dst, "namespace", Env("PELGUARD_NAMESPACE", consumer.DefaultNamespace), help+" [PELGUARD_NAMESPACE]")
}
