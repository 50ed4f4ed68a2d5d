package meterledger

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// Meter spend caps (migration 00019): how much of a meter one Stripe
// customer may be sent per calendar month (UTC, by the event's timestamp),
// in the meter's units. meter_usage counts, per meter, customer and month,
// the events recorded sending, delivered or parked — what may count at
// Stripe — for every customer, capped or not. Reserve adds an event's value
// in the statement that writes its row, and only while the cap allows it
// (the check and the addition are one row update, on the latest committed
// count); Finish takes a Failed event's value back. So a cap is never
// passed, whatever the fleet does at once, and a cap set mid-month starts
// from what the customer already used.

// Counts is what a meter cap bounds.
type Counts string

const (
	// CountUnits bounds the sum of the events' values (sum meters). An
	// event of zero or negative value always passes: it adds nothing.
	CountUnits Counts = "units"
	// CountEvents bounds the number of events (count meters, whose values
	// Stripe ignores).
	CountEvents Counts = "events"
)

// AnyCustomer and AnyMonth make a cap apply to every customer of the meter
// (each counted on its own) or every month. A customer's own cap comes
// before AnyCustomer's, a month's before AnyMonth's.
const (
	AnyCustomer = "*"
	AnyMonth    = "*"
)

// Cap is one meter spend cap.
type Cap struct {
	EventName        string
	StripeCustomerID string // a customer, or AnyCustomer
	Month            string // "2026-12", or AnyMonth
	Cap              int64
	Counts           Counts
	UpdatedAt        time.Time
}

// Allows reports whether an event of value fits under the cap, with units
// and events already counted.
func (c Cap) Allows(units, events, value int64) bool {
	if c.Counts == CountEvents {
		return events+1 <= c.Cap
	}
	return value <= 0 || units+value <= c.Cap
}

// Used is what counts against the cap out of units and events.
func (c Cap) Used(units, events int64) int64 {
	if c.Counts == CountEvents {
		return events
	}
	return units
}

// Usage is one customer's use of a meter in a month.
type Usage struct {
	EventName        string
	StripeCustomerID string
	Month            time.Time // the month's first day, UTC
	Units            int64     // the sum of the values of the events sending, delivered or parked
	Events           int64     // their number
}

// CapState is the cap an event was refused by (Decision OverCap) and the
// customer's use of the meter that month when it was.
type CapState struct {
	Cap    Cap
	Units  int64
	Events int64
	Month  time.Time
}

// MonthOf is the calendar month (UTC) that t's events count in: its first
// day, 00:00 UTC.
func MonthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

var monthRE = regexp.MustCompile(`^[0-9]{4}-(0[1-9]|1[0-2])$`)

// ValidMonth checks a cap's month: YYYY-MM, or AnyMonth.
func ValidMonth(m string) error {
	if m == AnyMonth || monthRE.MatchString(m) {
		return nil
	}
	return fmt.Errorf("month %q: want YYYY-MM (2026-12) or %s for every month", m, AnyMonth)
}

// Validate checks a cap before it is written.
func (c Cap) Validate() error {
	switch {
	case c.EventName == "" || len(c.EventName) > 100:
		return errors.New("a meter cap needs the meter's event name (1-100 bytes)")
	case c.StripeCustomerID == "" || len(c.StripeCustomerID) > 255:
		return fmt.Errorf("a meter cap needs a Stripe customer id, or %s for every customer", AnyCustomer)
	case c.Cap < 0:
		return fmt.Errorf("meter cap %d: not negative", c.Cap)
	case c.Counts != CountUnits && c.Counts != CountEvents:
		return fmt.Errorf("meter cap counts %q: want %s or %s", c.Counts, CountUnits, CountEvents)
	}
	return ValidMonth(c.Month)
}

// monthSQL is MonthOf in SQL: the month (a date, its first day) the events
// of timestamp ts count in.
func monthSQL(ts string) string {
	return `date_trunc('month', ` + ts + ` AT TIME ZONE 'UTC')::date`
}

// applicableSQL is the precedence rule in SQL, written once: of the caps in
// table (aliased c), the one that applies to customer sc's events of meter
// name in month (a date) — the customer's own before '*', then the month's
// before '*' — as a FROM … LIMIT 1 clause.
func applicableSQL(table, name, sc, month string) string {
	return `FROM ` + table + ` c WHERE c.event_name = ` + name + ` AND c.stripe_customer_id IN (` + sc + `, '*')
			AND c.month IN (to_char(` + month + `, 'YYYY-MM'), '*')
		ORDER BY c.stripe_customer_id = '*', c.month = '*' LIMIT 1`
}

// capAllowsSQL is the applicable cap's verdict in SQL, true when none: the
// rule of Cap.Allows, checked where the count is updated. It reads the
// statement's CTE caps (the caps of the batch's meters, read once), and
// nothing more when the batch's meters have none.
func capAllowsSQL(name, sc, month, units, events, value string) string {
	return `CASE WHEN NOT EXISTS (SELECT 1 FROM caps) THEN true ELSE coalesce((
		SELECT CASE WHEN c.counts = 'events' THEN ` + events + ` + 1 <= c.cap
			ELSE ` + value + ` <= 0 OR ` + units + ` + ` + value + ` <= c.cap END
		` + applicableSQL("caps", name, sc, month) + `), true) END`
}

// uncountSQL takes the events of src (a relation with event_name,
// stripe_customer_id, event_ts and value, and its condition) back from
// their customers' use, at time at: Stripe refused them, or their rows
// were never written.
func uncountSQL(src, at string) string {
	return `UPDATE {schema}.meter_usage m SET units = m.units - g.units, events = m.events - g.events, updated_at = ` + at + `
	FROM (SELECT event_name, stripe_customer_id, ` + monthSQL("event_ts") + ` AS month, sum(value) AS units, count(*) AS events
		FROM ` + src + ` GROUP BY 1, 2, 3) g
	WHERE m.event_name = g.event_name AND m.stripe_customer_id = g.stripe_customer_id AND m.month = g.month`
}

// SetCap creates or changes a cap. It may be set below what a customer
// already used: the customer's next events that would count are refused
// until the cap is raised or the month ends (a cap bounds what is sent,
// it takes nothing back).
func (l *Ledger) SetCap(ctx context.Context, c Cap) (Cap, error) {
	if c.Counts == "" {
		c.Counts = CountUnits
	}
	if err := c.Validate(); err != nil {
		return Cap{}, fmt.Errorf("meter ledger: %w", err)
	}
	err := l.pool.QueryRow(ctx, `INSERT INTO {schema}.meter_caps (event_name, stripe_customer_id, month, cap, counts, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (event_name, stripe_customer_id, month) DO UPDATE SET cap = EXCLUDED.cap, counts = EXCLUDED.counts,
			updated_at = EXCLUDED.updated_at
		RETURNING updated_at`, c.EventName, c.StripeCustomerID, c.Month, c.Cap, string(c.Counts), l.clock.Now()).Scan(&c.UpdatedAt)
	if err != nil {
		return Cap{}, fmt.Errorf("setting the %s cap of %s for %s: %w", c.EventName, c.StripeCustomerID, c.Month, err)
	}
	c.UpdatedAt = c.UpdatedAt.UTC()
	return c, nil
}

// RemoveCap deletes a cap; ErrNotFound when there is none.
func (l *Ledger) RemoveCap(ctx context.Context, eventName, stripeCustomerID, month string) error {
	tag, err := l.pool.Exec(ctx, `DELETE FROM {schema}.meter_caps WHERE event_name = $1 AND stripe_customer_id = $2 AND month = $3`,
		eventName, stripeCustomerID, month)
	if err != nil {
		return fmt.Errorf("removing the %s cap of %s for %s: %w", eventName, stripeCustomerID, month, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("the %s cap of %s for %s: %w", eventName, stripeCustomerID, month, ErrNotFound)
	}
	return nil
}

// Caps lists the caps of eventName (every meter's when empty).
func (l *Ledger) Caps(ctx context.Context, eventName string) ([]Cap, error) {
	rows, err := l.pool.Query(ctx, `SELECT event_name, stripe_customer_id, month, cap, counts, updated_at
		FROM {schema}.meter_caps WHERE $1 = '' OR event_name = $1
		ORDER BY event_name, stripe_customer_id = '*' DESC, stripe_customer_id, month = '*' DESC, month DESC`, eventName)
	if err != nil {
		return nil, fmt.Errorf("listing meter caps: %w", err)
	}
	return pgx.CollectRows(rows, scanCap)
}

func scanCap(r pgx.CollectableRow) (Cap, error) {
	var c Cap
	var counts string
	err := r.Scan(&c.EventName, &c.StripeCustomerID, &c.Month, &c.Cap, &counts, &c.UpdatedAt)
	c.Counts, c.UpdatedAt = Counts(counts), c.UpdatedAt.UTC()
	return c, err
}

// CapFor returns the cap that applies to a customer's events of eventName
// in month (the most specific); found is false when none does.
func (l *Ledger) CapFor(ctx context.Context, eventName, stripeCustomerID string, month time.Time) (c Cap, found bool, err error) {
	rows, err := l.pool.Query(ctx, `SELECT c.event_name, c.stripe_customer_id, c.month, c.cap, c.counts, c.updated_at
		`+applicableSQL("{schema}.meter_caps", "$1", "$2", "$3::date"), eventName, stripeCustomerID, MonthOf(month))
	if err != nil {
		return Cap{}, false, fmt.Errorf("reading the %s cap of %s: %w", eventName, stripeCustomerID, err)
	}
	caps, err := pgx.CollectRows(rows, scanCap)
	if err != nil || len(caps) == 0 {
		return Cap{}, false, err
	}
	return caps[0], true, nil
}

// Usage reads customers' use of eventName in month, ordered by customer;
// all customers when stripeCustomerID is empty. A customer without events
// that month is not listed.
func (l *Ledger) Usage(ctx context.Context, eventName, stripeCustomerID string, month time.Time) ([]Usage, error) {
	rows, err := l.pool.Query(ctx, `SELECT event_name, stripe_customer_id, month, units, events FROM {schema}.meter_usage
		WHERE event_name = $1 AND ($2 = '' OR stripe_customer_id = $2) AND month = $3 ORDER BY stripe_customer_id`,
		eventName, stripeCustomerID, MonthOf(month))
	if err != nil {
		return nil, fmt.Errorf("reading %s usage: %w", eventName, err)
	}
	return pgx.CollectRows(rows, scanUsage)
}

// CustomerUsage reads a Stripe customer's use of every meter in month,
// ordered by meter (by meter_usage_customer_idx).
func (l *Ledger) CustomerUsage(ctx context.Context, stripeCustomerID string, month time.Time) ([]Usage, error) {
	rows, err := l.pool.Query(ctx, `SELECT event_name, stripe_customer_id, month, units, events FROM {schema}.meter_usage
		WHERE stripe_customer_id = $1 AND month = $2 ORDER BY event_name`, stripeCustomerID, MonthOf(month))
	if err != nil {
		return nil, fmt.Errorf("reading the meter usage of %s: %w", stripeCustomerID, err)
	}
	return pgx.CollectRows(rows, scanUsage)
}

// CustomerMeters reports how many meters a Stripe customer was sent events
// of in the months the ledger keeps counts for, and the latest such month
// (zero when none).
func (l *Ledger) CustomerMeters(ctx context.Context, stripeCustomerID string) (meters int, latest time.Time, err error) {
	var last *time.Time
	err = l.pool.QueryRow(ctx, `SELECT count(DISTINCT event_name), max(month) FROM {schema}.meter_usage WHERE stripe_customer_id = $1`,
		stripeCustomerID).Scan(&meters, &last)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("reading the meters of %s: %w", stripeCustomerID, err)
	}
	return meters, utc(last), nil
}

func scanUsage(r pgx.CollectableRow) (Usage, error) {
	var u Usage
	err := r.Scan(&u.EventName, &u.StripeCustomerID, &u.Month, &u.Units, &u.Events)
	u.Month = u.Month.UTC()
	return u, err
}

// usageKeep is how many months of meter_usage are kept before the current
// one.
const usageKeep = 12

// pruneUsage deletes the counts of months before the last usageKeep.
func (l *Ledger) pruneUsage(ctx context.Context, now time.Time) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM {schema}.meter_usage WHERE month < $1`, MonthOf(now).AddDate(0, -usageKeep, 0))
	if err != nil {
		return 0, fmt.Errorf("pruning meter usage: %w", err)
	}
	return tag.RowsAffected(), nil
}

// capReason says why an event of customer is refused by its cap.
func capReason(s CapState, customer string, value int64) string {
	scope := "its own cap"
	switch {
	case s.Cap.StripeCustomerID == AnyCustomer && s.Cap.Month == AnyMonth:
		scope = "the cap of every customer, every month"
	case s.Cap.StripeCustomerID == AnyCustomer:
		scope = "the cap of every customer in " + s.Cap.Month
	case s.Cap.Month == AnyMonth:
		scope = "its own cap, every month"
	}
	adds := value
	if s.Cap.Counts == CountEvents {
		adds = 1
	}
	return fmt.Sprintf("would pass the %s cap of %d %s for %s in %s (%s): %d used, this event adds %d; not sent: raise the cap, then replay",
		s.Cap.EventName, s.Cap.Cap, s.Cap.Counts, customer, s.Month.Format("2006-01"), scope, s.Cap.Used(s.Units, s.Events), adds)
}

// CapUse is a cap with what it bounds in a month.
type CapUse struct {
	Cap
	// Customers is how many customers with events that month the cap
	// applies to (their own cap, or a more specific one, comes first);
	// Reached how many of them used all of it.
	Customers, Reached int
	// Used is the customer's use, for a cap of one customer.
	Used int64
}

// CapsInUse lists the caps of eventName (every meter's when empty) that
// apply in month, each with what it bounds that month, in one query.
func (l *Ledger) CapsInUse(ctx context.Context, eventName string, month time.Time) ([]CapUse, error) {
	month = MonthOf(month)
	rows, err := l.pool.Query(ctx, `WITH caps AS MATERIALIZED (
			SELECT * FROM {schema}.meter_caps WHERE ($1 = '' OR event_name = $1) AND month IN (to_char($2::date, 'YYYY-MM'), '*')
		), used AS (
			SELECT c.event_name, c.stripe_customer_id, c.month,
				CASE WHEN c.counts = 'events' THEN u.events ELSE u.units END AS used, c.cap
			FROM {schema}.meter_usage u
			CROSS JOIN LATERAL (SELECT * `+applicableSQL("caps", "u.event_name", "u.stripe_customer_id", "$2::date")+`) c
			WHERE u.month = $2::date AND ($1 = '' OR u.event_name = $1)
		)
		SELECT c.event_name, c.stripe_customer_id, c.month, c.cap, c.counts, c.updated_at,
			count(u.used)::int, (count(*) FILTER (WHERE u.used >= u.cap))::int, coalesce(sum(u.used), 0)::bigint
		FROM caps c LEFT JOIN used u ON u.event_name = c.event_name AND u.stripe_customer_id = c.stripe_customer_id AND u.month = c.month
		GROUP BY c.event_name, c.stripe_customer_id, c.month, c.cap, c.counts, c.updated_at
		ORDER BY c.event_name, c.stripe_customer_id = '*' DESC, c.stripe_customer_id, c.month = '*' DESC, c.month DESC`,
		eventName, month)
	if err != nil {
		return nil, fmt.Errorf("reading meter caps in use: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (CapUse, error) {
		var c CapUse
		var counts string
		err := r.Scan(&c.EventName, &c.StripeCustomerID, &c.Month, &c.Cap.Cap, &counts, &c.UpdatedAt, &c.Customers, &c.Reached, &c.Used)
		c.Counts, c.UpdatedAt = Counts(counts), c.UpdatedAt.UTC()
		if c.StripeCustomerID == AnyCustomer {
			c.Used = 0
		}
		return c, err
	})
}
