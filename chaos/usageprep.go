package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// pelguard's usage cells need a migrated schema with meter_events' daily
// partitions (38 of them: Stripe's 35 days, a day of margin, two ahead),
// seconds of DDL on a loaded machine. The usage scenarios run one after
// another and their pelguard cells share one schema, kept apart by a meter
// (event name) of each scenario's own: their identifiers, ledger rows and
// customer-meter slots never meet. The drill makes that schema in the
// background once the first charge cell has made its own (migrations are
// serialised database-wide by goose's advisory lock, so it must not delay
// that cell's), or at once when no charge scenario runs.

// preparedSchema is the usage cells' schema, made ahead.
type preparedSchema struct {
	pool   *pgxpool.Pool
	url    string
	schema string
	err    error
}

// schemaPrep makes the usage cells' schema in the background.
type schemaPrep struct {
	needed bool
	done   chan struct{} // closed once ps is set
	ps     preparedSchema
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// begin lets the making begin.
	begin     chan struct{}
	beginOnce sync.Once
}

// prepareUsageSchema starts making the schema when scenarios hold a usage
// scenario that will run. wait must be called before the drill removes its
// schemas.
func (d *drill) prepareUsageSchema(ctx context.Context, scenarios []string) *schemaPrep {
	ctx, cancel := context.WithCancel(ctx)
	p := &schemaPrep{done: make(chan struct{}), cancel: cancel, begin: make(chan struct{})}
	for _, sc := range scenarios {
		if (isUsage(sc) || isVolume(sc)) && (sc != ScenarioUsageAOFRollback || redisServerMissing() == "") {
			p.needed = true
		}
	}
	if !p.needed {
		close(p.done)
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(p.done)
		select {
		case <-p.begin:
		case <-ctx.Done():
			p.ps.err = ctx.Err()
			return
		}
		ps := &p.ps
		ps.pool, ps.url, ps.schema, ps.err = d.newSchema(ctx, "usage")
		if ps.err == nil {
			ps.err = ensurePartitions(ctx, ps.pool, ps.schema)
		}
	}()
	return p
}

func ensurePartitions(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	l, err := meterledger.New(pool, meterledger.Config{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := l.EnsurePartitions(ctx, time.Now()); err != nil {
		return fmt.Errorf("making meter_events' partitions in %s: %w", schema, err)
	}
	return nil
}

// start lets the background make the schema: a charge cell has made its
// own, or the usage scenarios begin.
func (p *schemaPrep) start() { p.beginOnce.Do(func() { close(p.begin) }) }

// take returns the schema once it is made. The pool stays the prep's: a
// cell must not close it.
func (p *schemaPrep) take(ctx context.Context) (preparedSchema, error) {
	if !p.needed {
		return preparedSchema{}, fmt.Errorf("no schema prepared for the usage scenarios")
	}
	p.start()
	select {
	case <-p.done:
		return p.ps, p.ps.err
	case <-ctx.Done():
		return preparedSchema{}, ctx.Err()
	}
}

// wait stops the making and closes the pool; the schema itself is the
// drill's to drop.
func (p *schemaPrep) wait() {
	p.cancel()
	p.wg.Wait()
	<-p.done
	if p.ps.pool != nil {
		p.ps.pool.Close()
	}
}
