package alerts

import "github.com/pelguard/pelguard/internal/redact"

// Redact removes secrets from s. It is internal/redact.String, pelguard's one
// redaction function (Stripe keys and client secrets, Slack tokens and
// webhook URLs, passwords in URLs and key=value pairs, bearer credentials,
// card numbers), kept under this name because every text the alerts package
// sends or logs passes through it, so that an error string that happens to
// carry a DSN or a key (invariant 7 of the design) never reaches Slack.
func Redact(s string) string { return redact.String(s) }
