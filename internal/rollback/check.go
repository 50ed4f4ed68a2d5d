package rollback

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/pelguard/pelguard/alerts"
	"github.com/pelguard/pelguard/internal/ledger"
	"github.com/pelguard/pelguard/internal/meterledger"
)

// querier is a connection (a new one, in AfterConnect) or the pool. Every
// statement goes through m.db.SQL for the schema.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// state is what the ledger holds now.
type state struct {
	ledgerID  string
	server    int64 // ledger.ServerIdentitySQL of the server read
	rows      map[string]int64
	stamps    map[string]time.Time // each row's updated_at
	open      bool
	lostSince time.Time
}

// raiseScript sets each named field of the hash to the larger of its value
// and the given one: the mirror only ever moves up, whoever writes it.
var raiseScript = redis.NewScript(`
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1`)

// redisKey is the mirror of one ledger (ledger_fence.ledger_id): two
// ledgers sharing a Redis never compare each other's witnesses.
func redisKey(ledgerID string) string { return "pelguard:ledger-witness:" + ledgerID }

func undefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") // undefined table, undefined schema
}

func (m *Monitor) read(ctx context.Context, q querier) (state, bool, error) {
	var st state
	var lost *time.Time
	err := q.QueryRow(ctx, m.db.SQL(`SELECT f.ledger_id,
		(SELECT min(lost_since) FROM {schema}.ledger_rollbacks WHERE repaired_at IS NULL), `+ledger.ServerIdentitySQL+`
		FROM {schema}.ledger_fence f`)).Scan(&st.ledgerID, &lost, &st.server)
	if errors.Is(err, pgx.ErrNoRows) || undefinedTable(err) {
		return st, false, nil // not migrated yet: nothing is witnessed
	}
	if err != nil {
		return st, false, fmt.Errorf("reading the ledger's fence: %w", err)
	}
	if lost != nil {
		st.open, st.lostSince = true, *lost
	}
	st.rows, st.stamps, err = witnessRows(ctx, q, m.db.SQL(`SELECT writer, seq, updated_at FROM {schema}.ledger_witness`))
	return st, true, err
}

func witnessRows(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string) (map[string]int64, map[string]time.Time, error) {
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the ledger witnesses: %w", err)
	}
	defer rows.Close()
	out, stamps := map[string]int64{}, map[string]time.Time{}
	for rows.Next() {
		var w string
		var seq int64
		var at time.Time
		if err := rows.Scan(&w, &seq, &at); err != nil {
			return nil, nil, fmt.Errorf("reading the ledger witnesses: %w", err)
		}
		out[w], stamps[w] = seq, at
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading the ledger witnesses: %w", err)
	}
	return out, stamps, nil
}

func newestOf(stamps map[string]time.Time) time.Time {
	var newest time.Time
	for _, at := range stamps {
		if at.After(newest) {
			newest = at
		}
	}
	return newest
}

// check compares once and acts on a loss.
// Checks run at once (the periodic one, one per new connection, one per
// write that met an unchecked server): each applies what it read only if
// no check that began reading later has applied its own, so a read from
// before a detection never clears the suspicion the detection raised.
func (m *Monitor) check(ctx context.Context, q querier) error {
	gen := m.gen.Add(1)
	st, ok, err := m.read(ctx, q)
	if err != nil || !ok {
		return err
	}
	seen := m.witnessed(ctx, st.ledgerID)
	if losses := Compare(st.rows, seen); len(losses) > 0 {
		if err := m.detect(ctx, q, seen); err != nil {
			return err
		}
		gen = m.gen.Add(1)
		if st, _, err = m.read(ctx, q); err != nil {
			return err
		}
	}
	m.remember(st)
	m.publish(ctx, st)
	m.apply(gen, func() {
		m.setOpen(st.open, st.lostSince)
		m.server.Store(st.server)
	})
	return nil
}

// apply runs set, the state a read of generation gen found, unless a read
// that began later was applied already.
func (m *Monitor) apply(gen uint64, set func()) {
	m.stateMu.Lock()
	defer m.stateMu.Unlock()
	if gen < m.applied {
		return
	}
	m.applied = gen
	set()
}

// witnessed is every value this process knows was committed: its memory
// and Redis's mirror. A Redis that cannot be read leaves memory alone.
func (m *Monitor) witnessed(ctx context.Context, ledgerID string) map[string]int64 {
	m.mu.Lock()
	if m.ledgerID != ledgerID {
		// Another ledger (a new database): its witnesses are its own.
		m.ledgerID, m.mem = ledgerID, map[string]seen{}
		m.committed.Store(0)
		m.mirrored.Store(0)
	}
	seen := make(map[string]int64, len(m.mem))
	old := m.cfg.Clock.Now().Add(-forgetAfter)
	for w, s := range m.mem {
		if s.changed.Before(old) {
			delete(m.mem, w) // idle: its row may be pruned
			continue
		}
		seen[w] = s.seq
	}
	m.mu.Unlock()
	if m.cfg.Redis == nil {
		return seen
	}
	got, err := m.cfg.Redis.HGetAll(ctx, redisKey(ledgerID)).Result()
	if err != nil {
		m.cfg.Logger.Warn("reading the ledger witness mirror in Redis: comparing with this process's memory alone", "err", err)
		return seen
	}
	for w, v := range got {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > seen[w] {
			seen[w] = n
		}
	}
	return seen
}

// remember keeps what the ledger holds: a value read committed is as good
// a witness as one written.
func (m *Monitor) remember(st state) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for w, s := range st.rows {
		m.see(w, s, st.stamps[w])
	}
}

// seen is one writer's highest known value and when it last grew.
type seen struct {
	seq     int64
	changed time.Time
}

// see records a value committed at at; m.mu is held.
func (m *Monitor) see(writer string, seq int64, at time.Time) {
	if cur, ok := m.mem[writer]; !ok || seq > cur.seq {
		m.mem[writer] = seen{seq: seq, changed: at}
	}
}

// prune deletes the witness rows of writers idle for PruneAfter, from Redis
// first: a value Redis still holds while Postgres has deleted its row would
// read as a loss.
func (m *Monitor) prune(ctx context.Context, now time.Time) {
	if m.db.Pool == nil {
		return
	}
	rows, err := m.db.Query(ctx, `SELECT writer FROM {schema}.ledger_witness WHERE updated_at < $1`, now.Add(-PruneAfter))
	if err != nil {
		return
	}
	writers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(writers) == 0 {
		return
	}
	if m.cfg.Redis != nil {
		if id := m.ledger(); id == "" || m.cfg.Redis.HDel(ctx, redisKey(id), writers...).Err() != nil {
			return
		}
	}
	if _, err := m.db.Exec(ctx, `DELETE FROM {schema}.ledger_witness WHERE writer = ANY($1) AND updated_at < $2`,
		writers, now.Add(-PruneAfter)); err == nil {
		m.cfg.Logger.Info("pruned the witness rows of writers idle for a week", "writers", len(writers))
	}
}

// publish mirrors what the ledger holds to Redis, so a writer that dies
// before its own Mirror is still witnessed.
func (m *Monitor) publish(ctx context.Context, st state) {
	if m.cfg.Redis == nil || len(st.rows) == 0 {
		return
	}
	args := make([]any, 0, 2*len(st.rows))
	fresh := m.cfg.Clock.Now().Add(-forgetAfter)
	for w, s := range st.rows {
		if st.stamps[w].After(fresh) { // an idle writer's row may be being pruned
			args = append(args, w, s)
		}
	}
	if len(args) == 0 {
		return
	}
	if err := raiseScript.Run(ctx, m.cfg.Redis, []string{redisKey(st.ledgerID)}, args...).Err(); err != nil && ctx.Err() == nil {
		m.cfg.Logger.Warn("mirroring the ledger witnesses to Redis", "err", err)
	}
}

func (m *Monitor) setOpen(open bool, lostSince time.Time) {
	m.open.Store(open)
	m.lostSince.Store(lostSince.UnixNano())
	m.metrics.setOpen(open)
}

// detect records a rollback, once, in one transaction under an advisory
// lock: the fence first (the epoch floor raised past anything the lost
// history issued; every pending and processing row and every external
// lease moved above it, leases released), the witnesses raised to what was
// seen (the same evidence is not a second rollback), and the rollback row
// (a detection while the last one is open, or soon after it, joins it).
func (m *Monitor) detect(ctx context.Context, q querier, seen map[string]int64) error {
	now := m.cfg.Clock.Now().Truncate(time.Microsecond)
	tx, err := q.Begin(ctx)
	if err != nil {
		return fmt.Errorf("recording a ledger rollback: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	sql := m.db.SQL
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "pelguard.ledger_rollback."+m.cfg.Schema); err != nil {
		return fmt.Errorf("locking the ledger's rollback record: %w", err)
	}
	rows, stamps, err := witnessRows(ctx, tx, sql(`SELECT writer, seq, updated_at FROM {schema}.ledger_witness`))
	if err != nil {
		return err
	}
	newest := newestOf(stamps)
	losses := Compare(rows, seen)
	if len(losses) == 0 {
		return tx.Commit(ctx) // another process recorded it while we waited
	}
	if newest.IsZero() {
		var charged *time.Time
		if err := tx.QueryRow(ctx, sql(`SELECT max(charged_at) FROM {schema}.billing_records WHERE status = 'charged'`)).Scan(&charged); err != nil {
			return fmt.Errorf("reading the ledger's last charge: %w", err)
		}
		if charged != nil {
			newest = *charged
		}
	}
	lostSince := LostSince(newest, m.cfg.Margin, now.Add(-7*24*time.Hour))

	var floor, live int64
	if err := tx.QueryRow(ctx, sql(`SELECT epoch_floor FROM {schema}.ledger_fence FOR UPDATE`)).Scan(&floor); err != nil {
		return fmt.Errorf("reading the epoch floor: %w", err)
	}
	if err := tx.QueryRow(ctx, sql(`SELECT greatest(
			(SELECT coalesce(max(epoch), 0) FROM {schema}.billing_records WHERE status IN ('pending', 'processing')),
			(SELECT coalesce(max(epoch), 0) FROM {schema}.external_leases))`)).Scan(&live); err != nil {
		return fmt.Errorf("reading the live epochs: %w", err)
	}
	meterLive, err := meterledger.MaxLiveEpoch(ctx, m.db.WrapTx(tx))
	if err != nil {
		return fmt.Errorf("reading the live meter event epochs: %w", err)
	}
	floor = max(floor+fenceStride, live+1, meterLive+1)
	if _, err := tx.Exec(ctx, sql(`UPDATE {schema}.ledger_fence SET epoch_floor = $1, updated_at = $2`), floor, now); err != nil {
		return fmt.Errorf("raising the epoch floor: %w", err)
	}
	var fenced int64
	for _, stmt := range []string{
		`UPDATE {schema}.billing_records SET epoch = $1::bigint + 1, lease_owner = NULL, lease_expires_at = NULL, updated_at = $2
			WHERE status = 'pending'`,
		`UPDATE {schema}.billing_records SET epoch = $1::bigint + 1, updated_at = $2 WHERE status = 'processing'`,
		`UPDATE {schema}.external_leases SET epoch = $1::bigint + 1, updated_at = $2`,
	} {
		tag, err := tx.Exec(ctx, sql(stmt), floor, now)
		if err != nil {
			return fmt.Errorf("fencing the ledger after a rollback: %w", err)
		}
		fenced += tag.RowsAffected()
	}
	meterFenced, err := meterledger.Fence(ctx, m.db.WrapTx(tx), floor)
	if err != nil {
		return fmt.Errorf("fencing the meter events after a rollback: %w", err)
	}
	fenced += meterFenced
	for _, l := range losses {
		if _, err := tx.Exec(ctx, sql(`INSERT INTO {schema}.ledger_witness AS w (writer, seq, updated_at) VALUES ($1, $2, $3)
			ON CONFLICT (writer) DO UPDATE SET seq = greatest(w.seq, excluded.seq)`), l.Writer, l.Witnessed, now); err != nil {
			return fmt.Errorf("raising the witness of %s: %w", l.Writer, err)
		}
	}
	evidence := Evidence(losses)
	var id int64
	merged := true
	err = tx.QueryRow(ctx, sql(`UPDATE {schema}.ledger_rollbacks SET evidence = left(evidence || '; ' || $1, 4000),
			lost_since = least(lost_since, $2), epoch_floor = $3, rows_fenced = rows_fenced + $4,
			repaired_at = NULL, repair_started_at = NULL
		WHERE id = (SELECT max(id) FROM {schema}.ledger_rollbacks WHERE detected_at > $5 OR repaired_at IS NULL)
		RETURNING id`), evidence, lostSince, floor, fenced, now.Add(-MergeWithin)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		merged = false
		err = tx.QueryRow(ctx, sql(`INSERT INTO {schema}.ledger_rollbacks (detected_at, detected_by, evidence, lost_since,
				epoch_floor, rows_fenced) VALUES ($1, $2, left($3, 4000), $4, $5, $6) RETURNING id`),
			now, m.cfg.Writer, evidence, lostSince, floor, fenced).Scan(&id)
	}
	if err != nil {
		return fmt.Errorf("recording the ledger rollback: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing the ledger rollback: %w", err)
	}
	// Newer than any read begun before the commit: such a read, applied
	// late, must not clear it.
	m.apply(m.gen.Add(1), func() { m.setOpen(true, lostSince) })
	if merged {
		m.cfg.Logger.Warn("the ledger went back in time: more evidence of the recorded rollback",
			"rollback", id, "lost", evidence, "fenced", fenced)
		return nil
	}
	m.metrics.detected.Inc()
	m.cfg.Logger.Error("the ledger went back in time: commits were lost; fenced, asking Stripe before every charge until repaired",
		"rollback", id, "lost", evidence, "repair_reads_stripe_from", lostSince, "epoch_floor", floor, "fenced", fenced)
	if m.cfg.Notifier != nil {
		m.cfg.Notifier.Notify(alerts.LedgerRollback(id, evidence, lostSince, fenced))
	}
	return nil
}
