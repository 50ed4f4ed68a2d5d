package cli

import (
	"flag"
	"time"

	"github.com/pelguard/pelguard/consumer"
	"github.com/pelguard/pelguard/event"
)

// Charging are the flags a charge depends on, shared by the consumer and
// the reaper (whose re-drives must charge exactly as the consumers do: the
// namespace is in the idempotency key, the description and metadata are
// the request Stripe compares under that key).
type Charging struct {
	Namespace         string
	SafeKeyWindow     time.Duration
	RequireCap        bool
	MaxAmountCents    int64
	StrictFields      bool
	ChargeDescription string
	ChargeMetadata    bool
	// Retries: a re-drive's decline is recorded like a consumer's, so the
	// reaper takes the fleet's one policy too.
	Retries Retries
}

// Register adds the charging flags; namespaceHelp ends the --namespace help.
func (c *Charging) Register(fs *flag.FlagSet, namespaceHelp string) {
	RegisterNamespace(fs, &c.Namespace, "idempotency-key namespace; "+namespaceHelp)
	fs.DurationVar(&c.SafeKeyWindow, "safe-key-window", consumer.DefaultSafeKeyWindow, "after this long since the first attempt, look the charge up at Stripe before charging again")
	fs.BoolVar(&c.RequireCap, "require-cap", EnvBool("PELGUARD_REQUIRE_CAP", false), "refuse to charge a billing period without a spend cap [PELGUARD_REQUIRE_CAP]")
	fs.Int64Var(&c.MaxAmountCents, "max-amount-cents", event.DefaultMaxAmountCents, "reject events above this amount")
	fs.BoolVar(&c.StrictFields, "strict-fields", false, "reject events with fields other than the known ones (the five, and the optional occurred_at)")
	fs.StringVar(&c.ChargeDescription, "charge-description", Env("PELGUARD_CHARGE_DESCRIPTION", "Usage billing for {period}"), "the charge description; {period} is the billing period. Keep your old consumer's, so look-ups recognise its charges and its keys see the same request [PELGUARD_CHARGE_DESCRIPTION]")
	c.Retries.Register(fs)
	fs.BoolVar(&c.ChargeMetadata, "charge-metadata", EnvBool("PELGUARD_CHARGE_METADATA", true), "send pelguard's metadata with each charge; false sends the common request shape (with --stripe-mode charges and the team's --namespace, Stripe then accepts pelguard's charge under a key the team already used) [PELGUARD_CHARGE_METADATA]")
}

// Rules are the event rules the flags set.
func (c Charging) Rules() event.Rules {
	return event.Rules{MaxAmountCents: c.MaxAmountCents, StrictFields: c.StrictFields}
}

// Description is the charge description the flags set.
func (c Charging) Description() func(event.Event) string {
	return consumer.DescriptionTemplate(c.ChargeDescription)
}
