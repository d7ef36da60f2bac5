import Conveyor

/// The schema, its migrations and every statement the store sends, for one schema name.
///
/// Every value is a bound parameter; the only text spliced into SQL is the schema name (checked
/// to be a plain identifier, then quoted) and the notification channel derived from it.
///
/// Times are `timestamptz` rounded to whole milliseconds. Each statement that needs the time
/// takes it as a parameter (`$n::timestamptz`): the caller's clock reading with
/// ``PostgresJobStore/Clock/caller``, or NULL with ``PostgresJobStore/Clock/database``, in which
/// case ``now(_:)`` falls back to the server's `statement_timestamp()`: the time the statement
/// started, once every earlier statement of the transaction (and the lock waits in them) is done.
///
/// Statuses are literals, not parameters, so the planner matches the partial indexes.
/// A waiting job is stored `ready` once its run date has come and `scheduled` before that; a
/// claim first promotes the scheduled jobs that fell due, so the ready index is ordered by
/// priority and run date alone and a claim reads its first entries.
///
/// Which index each statement uses, checked with `EXPLAIN` on 300,000 analyzed rows
/// (`ExplainTests`: none reads the jobs table from end to end):
/// - `jobs_ready (queue, priority DESC, run_at, seq, id) WHERE status = 'ready'`: the claim
///   (``claim``) reads its first `limit` entries, skipping rows other workers hold; the next ready
///   date (``nextWake``) reads the first; the ready count (``counts``) walks it, index only; a
///   retry's place (``settle``) is one seek to the end of a range of it.
/// - `jobs_scheduled (queue, run_at) WHERE status = 'scheduled'`: promotion (``promote``), the
///   earliest scheduled date (``nextWake``) and the scheduled counts.
/// - `jobs_status (queue, status, id)`: rescues (``rescue``), the earliest lease expiry
///   (``nextWake``), the running and dead counts, listings (``list``: each status's part in ID
///   order), clearing by status.
/// - `jobs_dedup (queue, dedup_key) WHERE … waiting`: the duplicate check of an enqueue.
/// - `jobs_keyed (queue, dedup_key, status, finished_at) WHERE … running or completed`: the
///   wider deduplication scopes (version 7).
/// - `jobs_ordered (queue, ordering_key, id) WHERE … ready, scheduled, running, held or dead`:
///   the first job of an ordering key's line, one seek (version 9: an add's look at its line,
///   `promote_lines`, a re-queue's). Held jobs are in no other partial index: claims, promotion
///   and the next wake never read them; counts and listings find them in `jobs_status`.
/// - The primary key: settlements (``settle``), heartbeats, the claim's update, ``job``.
struct SQL {
  /// The quoted schema name, e.g. `"conveyor"`.
  let schema: String
  /// The channel `NOTIFY` uses; the payload is the queue name.
  let channel: String
  /// The channel a cancel announces the running jobs it cancelled on (``cancel``); the payload
  /// is ``CancelPayload``'s.
  let cancelChannel: String

  // The statements of adds, claims, settlements and heartbeats, built once: their text is also
  // the key of each connection's prepared statements. Built on every call, the claim's text alone
  // took a quarter of a one-job claim's time in the client.
  let insert: String
  let insertUniform: String
  let insertOne: String
  let settle: String
  let complete: String
  let completeWithoutHistory: String
  let promote: String
  let claim: String
  let limitedClaim: String
  let keyLimitedClaim: String
  let releaseDueKeys: String
  let limitLock: String
  let limitFull: String
  let heartbeat: String
  let checkpoint: String
  let rescue: String
  let nextWake: String
  let isPaused: String
  let notify: String
  let lockKeys: String
  let lockKeysOfQueues: String
  let findDuplicates: String

  init(schema name: String) {
    let schema = "\"\(name)\""
    self.schema = schema
    channel = "\(name).jobs"
    cancelChannel = "\(name).cancels"
    insert = Self.insert(schema, channel: channel)
    insertUniform = Self.insertUniform(schema, channel: channel)
    insertOne = Self.insertOne(schema, channel: channel)
    settle = Self.settle(schema)
    complete = Self.complete(schema)
    completeWithoutHistory = Self.completeWithoutHistory(schema)
    promote = Self.promote(schema)
    claim = Self.claim(schema)
    limitedClaim = Self.limitedClaim(schema)
    keyLimitedClaim = Self.keyLimitedClaim(schema)
    releaseDueKeys = Self.releaseDueKeys(schema)
    limitLock = Self.limitLock(schema)
    limitFull = Self.limitFull(schema)
    heartbeat = Self.heartbeat(schema)
    checkpoint = Self.checkpoint(schema)
    rescue = Self.rescue(schema)
    nextWake = Self.nextWake(schema)
    isPaused = Self.isPaused(schema)
    notify = Self.notify(channel)
    lockKeys = Self.lockKeys(schema)
    lockKeysOfQueues = Self.lockKeysOfQueues(schema)
    findDuplicates = Self.findDuplicates(schema)
  }

  /// The migrations, in order; version `n` is `migrations[n - 1]`.
  var migrations: [String] {
    [
      version1, version2, version3, version4, version5, version6, version7, version8, version9, version10,
      version11, version12, version13, version14,
    ]
  }

  /// The time of a statement: parameter `n`, or the server's clock when it is NULL.
  static func now(_ parameter: Int) -> String {
    "coalesce($\(parameter)::timestamptz, date_trunc('milliseconds', statement_timestamp()))"
  }

  /// The latest date a store keeps (`JobStoreTime.latest`).
  static let latest = "'9999-12-31 23:59:59+00'::timestamptz"

  /// Applied under the migration lock, in one transaction.
  var migrationTable: String {
    """
    CREATE SCHEMA IF NOT EXISTS \(schema);
    CREATE TABLE IF NOT EXISTS \(schema).schema_migrations (
      version integer PRIMARY KEY,
      applied_at timestamptz NOT NULL DEFAULT now()
    );
    """
  }
  /// Whether the migrations table exists (nil when it does not), read before anything is created.
  var migrationTableExists: String { "SELECT to_regclass('\(schema).schema_migrations') IS NOT NULL" }
  var currentVersion: String { "SELECT coalesce(max(version), 0)::int8 FROM \(schema).schema_migrations" }
  var recordVersion: String { "INSERT INTO \(schema).schema_migrations (version) VALUES ($1)" }
  /// Serialises migrations of this schema across every process: held until the transaction ends.
  static let migrationLock = "SELECT pg_advisory_xact_lock(hashtextextended('conveyor.migrate:' || $1, 0))"

  /// Version 1: the jobs and queues tables, their indexes, the insert trigger that registers
  /// queues and notifies workers, and `enqueue` for applications' own transactions.
  var version1: String {
    """
    CREATE TABLE \(schema).jobs (
      id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
      queue text NOT NULL,
      payload bytea NOT NULL,
      status text NOT NULL CHECK (status IN ('ready', 'scheduled', 'running', 'dead')),
      priority bigint NOT NULL DEFAULT 0,
      attempts bigint NOT NULL DEFAULT 0,
      run_at timestamptz NOT NULL,
      created_at timestamptz NOT NULL,
      last_error text,
      dedup_key bytea,
      lease_owner text,
      lease_expires_at timestamptz,
      claim_token bigint NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_ready ON \(schema).jobs (queue, priority DESC, run_at, id) WHERE status = 'ready';
    CREATE INDEX jobs_scheduled ON \(schema).jobs (queue, run_at) WHERE status = 'scheduled';
    CREATE INDEX jobs_dedup ON \(schema).jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('ready', 'scheduled');
    CREATE INDEX jobs_status ON \(schema).jobs (queue, status, id);
    CREATE TABLE \(schema).queues (name text PRIMARY KEY, paused boolean NOT NULL DEFAULT false);

    -- The advisory lock that serialises enqueues with the same deduplication key.
    CREATE FUNCTION \(schema).dedup_lock_key(queue text, key bytea) RETURNS bigint
      LANGUAGE sql IMMUTABLE PARALLEL SAFE
      AS $body$ SELECT hashtextextended('conveyor.dedup:' || queue || ':' || encode(key, 'hex'), 0) $body$;

    -- Every insert, by the store or by enqueue below, registers its queue and wakes the workers
    -- listening on the channel (delivered when the transaction commits, never before).
    CREATE FUNCTION \(schema).jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
      INSERT INTO \(schema).queues (name)
        SELECT DISTINCT i.queue FROM inserted i
        WHERE NOT EXISTS (SELECT 1 FROM \(schema).queues q WHERE q.name = i.queue)
        ON CONFLICT (name) DO NOTHING;
      PERFORM pg_notify('\(channel)', q.queue) FROM (SELECT DISTINCT queue FROM inserted) q;
      RETURN NULL;
    END
    $body$;
    CREATE TRIGGER jobs_inserted AFTER INSERT ON \(schema).jobs
      REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION \(schema).jobs_inserted();

    \(enqueueFunctions(waiting: "'ready', 'scheduled'", replacing: false))
    """
  }

  /// `enqueue`, for applications' own transactions (``version1``; ``version9`` counts held jobs
  /// as waiting). `waiting`: the statuses of a waiting duplicate, as SQL literals.
  private func enqueueFunctions(waiting: String, replacing: Bool) -> String {
    """
    -- Adds a job inside the caller's transaction (the outbox pattern): it exists if and only if
    -- that transaction commits. Returns the job's ID, or the ID of the waiting job with the same
    -- deduplication key. run_at NULL means now, by the database's clock.
    CREATE \(replacing ? "OR REPLACE " : "")FUNCTION \(schema).enqueue(
      queue text, payload bytea, priority bigint DEFAULT 0, run_at timestamptz DEFAULT NULL,
      dedup_key text DEFAULT NULL
    ) RETURNS bigint LANGUAGE plpgsql AS $body$
    DECLARE
      now_ timestamptz := date_trunc('milliseconds', statement_timestamp());
      key_ bytea := convert_to(dedup_key, 'UTF8');
      -- Clamped as every store clamps run dates (infinity included): year 1 to the end of 9999.
      when_ timestamptz := least(greatest(
        date_trunc('milliseconds', coalesce(run_at, statement_timestamp())),
        '0001-01-01 00:00:00+00'::timestamptz), '9999-12-31 23:59:59+00'::timestamptz);
      id_ bigint;
    BEGIN
      IF queue IS NULL OR queue !~ '^[A-Za-z0-9._-]{1,128}$' THEN
        RAISE EXCEPTION 'a queue name must be 1 to 128 characters from A-Z, a-z, 0-9, ".", "_" and "-"'
          USING ERRCODE = '22023';
      END IF;
      IF key_ IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(\(schema).dedup_lock_key(queue, key_));
        SELECT min(j.id) INTO id_ FROM \(schema).jobs j
          WHERE j.queue = enqueue.queue AND j.dedup_key = key_ AND j.status IN (\(waiting));
        IF id_ IS NOT NULL THEN RETURN id_; END IF;
      END IF;
      INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at, dedup_key)
        VALUES (queue, payload, CASE WHEN when_ <= now_ THEN 'ready' ELSE 'scheduled' END, priority,
          when_, now_, key_)
        RETURNING id INTO id_;
      RETURN id_;
    END
    $body$;
    CREATE \(replacing ? "OR REPLACE " : "")FUNCTION \(schema).enqueue(
      queue text, payload text, priority bigint DEFAULT 0, run_at timestamptz DEFAULT NULL,
      dedup_key text DEFAULT NULL
    ) RETURNS bigint LANGUAGE sql
      AS $body$ SELECT \(schema).enqueue(queue, convert_to(payload, 'UTF8'), priority, run_at, dedup_key) $body$;
    """
  }

  /// Version 2: workers' per-minute counts (`PostgresJobStore+Activity.swift`), keyed by queue and
  /// minute, with an index on the minute for the dashboard's read of the last hour and the pruning.
  var version2: String {
    """
    CREATE TABLE \(schema).activity (
      queue text NOT NULL,
      minute timestamptz NOT NULL,
      succeeded bigint NOT NULL DEFAULT 0,
      retried bigint NOT NULL DEFAULT 0,
      died bigint NOT NULL DEFAULT 0,
      started bigint NOT NULL DEFAULT 0,
      wait_total_ms bigint NOT NULL DEFAULT 0,
      wait_max_ms bigint NOT NULL DEFAULT 0,
      PRIMARY KEY (queue, minute)
    );
    CREATE INDEX activity_minute ON \(schema).activity (minute);
    """
  }

  /// The session setting a store's own connections carry (`on`): their inserts send the wake-up
  /// themselves, in the insert statement, so the trigger skips them.
  static let storeSessionSetting = "conveyor.store_session"

  /// Version 3: the insert trigger skips the store's own sessions (see
  /// ``storeSessionSetting``), whose insert statements send the wake-up themselves. Every other
  /// insert (``enqueue``, an application's own `INSERT`) still wakes the workers (and registers
  /// its queue) through it. The trigger's transition table and its two statements cost a third of
  /// a one-job add. Queues are listed from the jobs (``queueNames``), so the store's adds need not
  /// register theirs. `expect_inserted` lets the batch insert fail whole when a trigger drops
  /// rows.
  var version3: String {
    """
    DROP TRIGGER jobs_inserted ON \(schema).jobs;
    CREATE TRIGGER jobs_inserted AFTER INSERT ON \(schema).jobs
      REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT
      WHEN (current_setting('\(Self.storeSessionSetting)', true) IS DISTINCT FROM 'on')
      EXECUTE FUNCTION \(schema).jobs_inserted();

    -- Fails the store's batch insert (its one statement, so nothing of it commits) when a trigger
    -- of the application's dropped some of its rows.
    CREATE OR REPLACE FUNCTION \(schema).expect_inserted(inserted bigint, expected bigint) RETURNS void
      LANGUAGE plpgsql AS $body$
    BEGIN
      IF inserted <> expected THEN
        RAISE EXCEPTION 'the jobs table took % of % jobs (a trigger on it dropped rows); nothing of this add was stored',
          inserted, expected USING ERRCODE = '23000';
      END IF;
    END
    $body$;
    """
  }

  /// Version 4: a job's place among the ready jobs of its priority and run date (`seq`). 0 for a
  /// job added, scheduled or re-queued; a job retried straight into the ready state takes the
  /// next number of its queue's counter (`queues.retry_seq`, raised by ``settle`` once per
  /// statement for all its retries, in the order they were given), so it goes behind every job
  /// ready when it was retried, and jobs retried one after another keep that order. A release or
  /// rescue keeps it. The claim's index gains the column (rebuilt here, under the migration's
  /// lock: writers wait while it builds).
  ///
  /// It also refuses queue names with control characters (CR, LF, ESC, …): the store's own calls
  /// and `enqueue` never make them, but an application's own `INSERT` could, and such a name would
  /// garble every page and log line that shows it. `NOT VALID`: rows already stored are kept
  /// whatever their name; new rows and changed names are checked.
  var version4: String {
    """
    ALTER TABLE \(schema).jobs ADD CONSTRAINT jobs_queue_printable
      CHECK (queue !~ '[\\x01-\\x1f\\x7f]') NOT VALID;
    ALTER TABLE \(schema).jobs ADD COLUMN seq bigint NOT NULL DEFAULT 0;
    ALTER TABLE \(schema).queues ADD COLUMN retry_seq bigint NOT NULL DEFAULT 0;
    DROP INDEX \(schema).jobs_ready;
    CREATE INDEX jobs_ready ON \(schema).jobs (queue, priority DESC, run_at, seq, id) WHERE status = 'ready';
    """
  }

  /// Version 5: a job's own time limit in milliseconds (`NewJob.timeLimit`); NULL, every job
  /// stored before, keeps the queue's. Adding a nullable column rewrites no row.
  var version5: String {
    """
    ALTER TABLE \(schema).jobs ADD COLUMN time_limit_ms bigint;
    """
  }

  /// Version 6: the finished states `completed` and `cancelled`, and each job's history: when it
  /// finished, its attempts' errors (a JSON array of strings, as text: the latest
  /// `JobHistory.maximumErrors`), how long its last attempt ran, its output. The status check is
  /// replaced (checked against every row, under the migration lock). A dead job counts as finished
  /// when it is migrated (so none is pruned at the first start), and a job's last error starts its
  /// list (an error longer than `JobHistory.maximumErrorBytes`, which earlier versions kept whole,
  /// keeps its first 1,023 characters and "…": at most 4 bytes each, so within the bound).
  /// `jobs_finished` orders the history by finishing time, for pruning and history pages.
  /// The activity table counts handlers reported stuck per minute.
  /// The rows changed here keep their queue names whatever they are: the check of printable
  /// names (``version4``, `NOT VALID`) is set aside while they change, then set again.
  var version6: String {
    """
    ALTER TABLE \(schema).jobs DROP CONSTRAINT jobs_status_check;
    ALTER TABLE \(schema).jobs ADD CONSTRAINT jobs_status_check
      CHECK (status IN ('ready', 'scheduled', 'running', 'dead', 'completed', 'cancelled'));
    ALTER TABLE \(schema).jobs ADD COLUMN finished_at timestamptz, ADD COLUMN errors text,
      ADD COLUMN run_ms bigint, ADD COLUMN output bytea;
    ALTER TABLE \(schema).jobs DROP CONSTRAINT jobs_queue_printable;
    UPDATE \(schema).jobs SET finished_at = date_trunc('milliseconds', now()) WHERE status = 'dead';
    UPDATE \(schema).jobs SET errors = jsonb_build_array(
        CASE WHEN octet_length(last_error) > \(JobHistory.maximumErrorBytes)
        THEN left(last_error, \(JobHistory.maximumErrorBytes / 4 - 1)) || '…' ELSE last_error END)::text
      WHERE last_error IS NOT NULL;
    ALTER TABLE \(schema).jobs ADD CONSTRAINT jobs_queue_printable
      CHECK (queue !~ '[\\x01-\\x1f\\x7f]') NOT VALID;
    CREATE INDEX jobs_finished ON \(schema).jobs (queue, status, finished_at, id)
      WHERE status IN ('completed', 'cancelled', 'dead');
    ALTER TABLE \(schema).activity ADD COLUMN stuck bigint NOT NULL DEFAULT 0;
    """
  }

  /// Version 7: the running and completed jobs that have a deduplication key, by key, for the
  /// wider deduplication scopes (`DeduplicationScope.waitingOrRunning`, `.completedWithin`).
  /// Jobs without a key are in none of it, so their claims and completions never touch it.
  var version7: String {
    """
    CREATE INDEX jobs_keyed ON \(schema).jobs (queue, dedup_key, status, finished_at)
      WHERE dedup_key IS NOT NULL AND status IN ('running', 'completed');
    """
  }

  /// Version 8: stored schedules, one row each, keyed by queue and name (see
  /// `PostgresJobStore+Schedules`). Every column up to `paused` is the definition or its state as
  /// `StoredSchedule` holds it.
  var version8: String {
    """
    CREATE TABLE \(schema).schedules (
      queue text NOT NULL,
      name text NOT NULL,
      spacing text NOT NULL,
      time_zone text NOT NULL,
      catch_up text NOT NULL,
      jitter_ms bigint NOT NULL,
      payload bytea NOT NULL,
      priority bigint NOT NULL,
      time_limit_ms bigint,
      origin text NOT NULL,
      active boolean NOT NULL,
      paused boolean NOT NULL,
      created_at timestamptz NOT NULL,
      last_slot timestamptz,
      next_due timestamptz,
            dedup_key bytea,
      dedup_scope text NOT NULL,
      on_conflict text NOT NULL,
      PRIMARY KEY (queue, name)
    );
    CREATE INDEX schedules_due ON \(schema).schedules (queue, next_due) WHERE active AND NOT paused;
    """
  }

  /// The statuses of a line: the jobs of one queue and ordering key not finished yet (a dead job
  /// stays in its line, blocking it, until it is re-queued, removed or pruned). Only the line's
  /// lowest ID may be other than `held`.
  static let lineStatuses = "'ready', 'scheduled', 'running', 'held', 'dead'"

  /// Version 9: ordering keys (`NewJob.orderingKey`). A job's key (`ordering_key`, text: a key
  /// never holds NUL); the status `held` for a waiting job behind an earlier job of its line
  /// (see ``lineStatuses``), which is in no claim index, so claims never read it; `jobs_ordered`
  /// finds a line's lowest ID in one seek; held jobs are counted and listed through
  /// `jobs_status`; a held job counts as waiting for deduplication (`jobs_dedup` and `enqueue`
  /// are rebuilt to say so).
  ///
  /// `order_lock_key` is the advisory lock of a line, in a namespace of its own ('conveyor.order:'
  /// where deduplication has 'conveyor.dedup:'). `promote_lines` locks lines and then (a new
  /// statement, so a new snapshot: it sees what the transactions it waited for committed) makes
  /// the lowest ID of each line `scheduled` (seq 0) when it is held: the next claim's promotion
  /// makes it ready once its run date has come. Its statements see the changes of the statement
  /// that calls it (it is volatile), so a settlement calls it once its rows are changed.
  ///
  /// The lock order, which keeps ordinary traffic free of deadlocks: the rows of jobs that are
  /// not held (settlements, cancels, removals and prunes change them first), then the advisory
  /// locks of lines and deduplication keys, all taken in one pass in lock-key order, then held
  /// rows (only ever changed while their line's lock is held: promotion, and the second step of a
  /// cancel, remove or clear). An enqueue takes its locks before it inserts; a re-queue takes its
  /// locks first and skips dead rows another transaction holds.
  ///
  /// Adding a nullable column rewrites no row; the status check is checked against every row
  /// (`VALIDATE`, which blocks no writer once the new check is in place).
  var version9: String {
    """
    ALTER TABLE \(schema).jobs ADD COLUMN ordering_key text;
    ALTER TABLE \(schema).jobs DROP CONSTRAINT jobs_status_check;
    ALTER TABLE \(schema).jobs ADD CONSTRAINT jobs_status_check
      CHECK (status IN ('ready', 'scheduled', 'held', 'running', 'dead', 'completed', 'cancelled')) NOT VALID;
    ALTER TABLE \(schema).jobs VALIDATE CONSTRAINT jobs_status_check;
    CREATE INDEX jobs_ordered ON \(schema).jobs (queue, ordering_key, id)
      WHERE ordering_key IS NOT NULL AND status IN (\(Self.lineStatuses));
    DROP INDEX \(schema).jobs_dedup;
    CREATE INDEX jobs_dedup ON \(schema).jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('ready', 'scheduled', 'held');
    \(enqueueFunctions(waiting: "'ready', 'scheduled', 'held'", replacing: true))

    CREATE FUNCTION \(schema).order_lock_key(queue text, key text) RETURNS bigint
      LANGUAGE sql IMMUTABLE PARALLEL SAFE
      AS $body$ SELECT hashtextextended('conveyor.order:' || queue || ':' || key, 0) $body$;

    -- Locks the lines (queue, key) pairwise, in lock-key order; NULL keys are skipped.
    CREATE FUNCTION \(schema).lock_lines(queues text[], keys text[]) RETURNS void LANGUAGE plpgsql AS $body$
    BEGIN
      PERFORM pg_advisory_xact_lock(k) FROM (
        SELECT DISTINCT \(schema).order_lock_key(q, key) AS k FROM unnest(queues, keys) AS t(q, key)
        WHERE key IS NOT NULL
      ) AS l ORDER BY k;
    END
    $body$;

    -- Locks the lines, then makes the lowest ID of each, when it is held, ready if it was due when
    -- added (a clock stepped back since does not delay it) and scheduled otherwise (seq 0), and
    -- wakes the workers of the queues where it promoted a job. Returns how many it promoted.
    CREATE FUNCTION \(schema).promote_lines(queues text[], keys text[]) RETURNS bigint
      LANGUAGE plpgsql AS $body$
    DECLARE
      promoted bigint;
    BEGIN
      PERFORM \(schema).lock_lines(queues, keys);
      WITH heads AS (
        UPDATE \(schema).jobs SET status = CASE WHEN run_at <= created_at THEN 'ready' ELSE 'scheduled' END,
          seq = 0 WHERE id = ANY(ARRAY(
          SELECT (SELECT j.id FROM \(schema).jobs j
              WHERE j.queue = t.q AND j.ordering_key = t.key AND j.status IN (\(Self.lineStatuses))
              ORDER BY j.id LIMIT 1)
          FROM (SELECT DISTINCT q, key FROM unnest(queues, keys) AS u(q, key) WHERE key IS NOT NULL) AS t))
        AND status = 'held'
        RETURNING queue
      )
      SELECT coalesce(sum(woken.n), 0) INTO promoted FROM (
        SELECT queue, count(*) AS n FROM heads GROUP BY queue
      ) AS woken, LATERAL (SELECT pg_notify('\(channel)', woken.queue)) AS wake;
      RETURN promoted;
    END
    $body$;
    """
  }

  /// Version 10: a queue's stored concurrency limit (`QueueLimits.concurrency`; NULL: none).
  /// Adding a nullable column rewrites no row.
  var version10: String {
    """
    ALTER TABLE \(schema).queues ADD COLUMN concurrency integer CHECK (concurrency > 0);
    """
  }

  /// Version 11: a queue's stored rate limit (`QueueLimits.rate`: starts a second and burst;
  /// NULL: none) and the rate's stored time (GCRA's theoretical arrival time, microseconds since
  /// 1970; NULL: no start taken yet). Adding nullable columns rewrites no row.
  var version11: String {
    """
    ALTER TABLE \(schema).queues ADD COLUMN rate float8 CHECK (rate > 0.00001 AND rate <= 1000000),
      ADD COLUMN burst integer CHECK (burst BETWEEN 1 AND 1000000), ADD COLUMN rate_time int8;
    """
  }

  /// Version 12: limits per key.
  /// - `jobs.limit_key`: the job's `NewJob.limitKey`; `jobs.parked`: true while the job is `held`
  ///   because a claim found its key at its limit (``keyLimitedClaim``). A trigger clears it
  ///   whenever the status leaves `held`, so `parked` implies `held`.
  /// - `queues.key_concurrency`: `QueueLimits.keyConcurrency`; `key_limits`: its overrides.
  /// - `jobs_key_running`: a key's running jobs, counted by a claim up to the key's limit;
  ///   `jobs_parked`: a key's parked jobs in claim order.
  /// - `key_stopped`: when a job of a limit key stops running, however it stops (settled,
  ///   cancelled, removed, rescued), or leaves the ready state other than by a claim (cancelled,
  ///   removed, replaced with a later run date: the job a stop made ready may go so), the first
  ///   parked job of its key becomes ready again, in its old place. It first takes the queue's limit lock (``limitLock``), as the claims of a queue
  ///   with limits per key do, so a claim that parks a job and a settlement that frees its key
  ///   never miss each other: the one that takes the lock second sees what the first committed
  ///   (the update is a new statement, so a new snapshot). A parked job another transaction has
  ///   locked is skipped (that transaction is cancelling, removing or replacing it). The job made
  ///   ready wakes the queue's workers (a `NOTIFY` at commit), as an add does.
  ///
  /// Adding nullable columns rewrites no row.
  var version12: String {
    """
    ALTER TABLE \(schema).jobs ADD COLUMN limit_key text, ADD COLUMN parked boolean;
    ALTER TABLE \(schema).queues ADD COLUMN key_concurrency integer CHECK (key_concurrency BETWEEN 1 AND 1000000);
    CREATE TABLE \(schema).key_limits (
      queue text NOT NULL,
      key text NOT NULL,
      concurrency integer NOT NULL CHECK (concurrency BETWEEN 1 AND 1000000),
      PRIMARY KEY (queue, key)
    );
    CREATE INDEX jobs_key_running ON \(schema).jobs (queue, limit_key)
      WHERE status = 'running' AND limit_key IS NOT NULL;
    CREATE INDEX jobs_parked ON \(schema).jobs (queue, limit_key, priority DESC, run_at, seq, id)
      WHERE status = 'held' AND parked;

    \(keyStopped(create: "CREATE", place: "p.run_at"))
    CREATE TRIGGER jobs_key_stopped AFTER UPDATE OF status ON \(schema).jobs FOR EACH ROW
      WHEN (OLD.limit_key IS NOT NULL AND (
        (OLD.status = 'running' AND NEW.status <> 'running')
        OR (OLD.status = 'ready' AND NEW.status NOT IN ('running', 'held'))))
      EXECUTE FUNCTION \(schema).key_stopped();
    CREATE TRIGGER jobs_key_deleted AFTER DELETE ON \(schema).jobs FOR EACH ROW
      WHEN (OLD.status IN ('running', 'ready') AND OLD.limit_key IS NOT NULL)
      EXECUTE FUNCTION \(schema).key_stopped();

    CREATE FUNCTION \(schema).unparked() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
      NEW.parked := NULL;
      RETURN NEW;
    END
    $body$;
    CREATE TRIGGER jobs_unparked BEFORE UPDATE OF status ON \(schema).jobs FOR EACH ROW
      WHEN (OLD.parked AND NEW.status <> 'held')
      EXECUTE FUNCTION \(schema).unparked();
    """
  }

  /// ``version12``'s `key_stopped` (`create`: the statement's verb), which makes the first parked
  /// job of the key ready, parked jobs ordered by `place` (an expression of the row `p`): the run
  /// date in version 12, the place of fair shares from version 14 on.
  private func keyStopped(create: String, place: String) -> String {
    """
    \(create) FUNCTION \(schema).key_stopped() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
      PERFORM pg_advisory_xact_lock(\(Self.limitLockKey(schema, queue: "OLD.queue")));
      UPDATE \(schema).jobs SET status = 'ready', parked = NULL WHERE id = (
        SELECT p.id FROM \(schema).jobs p
        WHERE p.queue = OLD.queue AND p.limit_key = OLD.limit_key AND p.status = 'held' AND p.parked
        ORDER BY p.priority DESC, \(place), p.seq, p.id LIMIT 1 FOR UPDATE SKIP LOCKED);
      IF FOUND THEN
        PERFORM pg_notify('\(channel)', OLD.queue);
      END IF;
      RETURN NULL;
    END
    $body$;
    """
  }

  /// Version 13: rates per limit key.
  /// - `queues.key_rate`, `queues.key_burst`: `QueueLimits.keyRate`; `key_rates`: its overrides.
  /// - `key_buckets`: per limit key with a rate, its bucket's stored time (`tat`, GCRA's,
  ///   microseconds since 1970; no row: a full bucket) and, while the rate holds jobs of the key
  ///   (parked, as for a key's concurrency limit), `due`: when the bucket gives them a start, and
  ///   `due_set`: the claim's time when it noted it. The first claim of the queue from `due`, or
  ///   with its clock before `due_set` (stepped back since), makes that many of them ready
  ///   (``releaseDueKeys``, `key_buckets_due`, `key_buckets_due_set`). Rows of buckets full for a
  ///   day and holding nothing are deleted as claims meet them (`key_buckets_full`). Written only
  ///   by claims and `setLimits`, under the queue's limit lock.
  var version13: String {
    """
    ALTER TABLE \(schema).queues ADD COLUMN key_rate float8 CHECK (key_rate > 0.00001 AND key_rate <= 1000000),
      ADD COLUMN key_burst integer CHECK (key_burst BETWEEN 1 AND 1000000);
    CREATE TABLE \(schema).key_rates (
      queue text NOT NULL,
      key text NOT NULL,
      rate float8 NOT NULL CHECK (rate > 0.00001 AND rate <= 1000000),
      burst integer NOT NULL CHECK (burst BETWEEN 1 AND 1000000),
      PRIMARY KEY (queue, key)
    );
    CREATE TABLE \(schema).key_buckets (
      queue text NOT NULL,
      key text NOT NULL,
      tat int8 NOT NULL,
      due int8,
      due_set int8,
      PRIMARY KEY (queue, key)
    );
    CREATE INDEX key_buckets_due ON \(schema).key_buckets (queue, due) WHERE due IS NOT NULL;
    CREATE INDEX key_buckets_due_set ON \(schema).key_buckets (queue, due_set) WHERE due IS NOT NULL;
    CREATE INDEX key_buckets_full ON \(schema).key_buckets (queue, tat) WHERE due IS NULL;
    """
  }

  /// A ready job's place in its priority's claim order: its turn (fair shares, ``version14``)
  /// or, without one, its run date. The indexes of the claim order are built on it, so every
  /// statement that orders ready or parked jobs writes it this way.
  static let place = "coalesce(turn, run_at)"

  /// Version 14: fair shares (`FairTurns` states the rule the other stores keep too).
  /// - `jobs.fairness_key`: the job's `NewJob.fairnessKey`.
  /// - `jobs.turn`: the turn the job took last (a ready job's place, ``place``) and
  ///   `jobs.turn_priority` the priority it took it at. A job keeps them when it stops being ready,
  ///   so a key's latest turn is the latest among its jobs (`jobs_key_turns`) and a priority's the
  ///   latest among all (`jobs_turns`): no row is written for a key, so two transactions taking
  ///   turns never wait for each other. A job deleted (completed with no history kept, pruned,
  ///   removed) takes its turn with it: a key whose jobs are all gone starts at the head again.
  ///   A job that takes a turn at another priority (a replacement changed it) leaves its old turn
  ///   in `turns_left`, so its key keeps its place at the old priority: a row each time, only
  ///   ever inserted, so two such replacements never wait for each other (an upsert of one row
  ///   per key and priority deadlocked two adds that moved jobs of one key in opposite ways).
  /// - `take_turn`, a trigger before a job with a fairness key is stored `ready`: it takes
  ///   `max(head, previous + 1 ms)` when the job was inserted, promoted (`scheduled`), re-queued
  ///   (`dead`) or given `turn = NULL` by the statement (a retry into the ready state, a
  ///   replacement); a job that keeps its place (released, rescued, let go by its limit key) keeps
  ///   its turn. `head` is the place of the first other job of its priority that is ready or held
  ///   by its limit key (`jobs_parked_place`: which jobs a claim has held yet is each store's own
  ///   choice, so the rule counts both), or with none the later of its run date and the
  ///   priority's latest turn. Its queries see the rows the
  ///   statement changed before this one, so the jobs of one statement take turns one at a time.
  ///   Two transactions may read the same latest turn of a key and give two jobs one turn (a tie,
  ///   broken as run dates are): under concurrent adds a key can get a job more in a round.
  /// - `jobs_ready` and `jobs_parked` are rebuilt on ``place``, and `key_stopped` lets parked jobs
  ///   go in that order.
  ///
  /// It also puts the schema's name in the advisory locks of deduplication keys and ordering keys
  /// (`dedup_lock_key`, `order_lock_key`), as the limit lock's already was: two schemas of one
  /// database with a queue of the same name no longer wait for each other's adds (each process
  /// calls the functions, so all take the new locks from the migration's commit on). The lock of
  /// schedule saves (``lockSchedulesOfQueue``) is written by each build, so a process of an older
  /// build keeps the old key until it stops (the PostgreSQL guide says so for upgrades).
  var version14: String {
    let name = schema.filter { $0 != "\"" }
    return """
      CREATE OR REPLACE FUNCTION \(schema).dedup_lock_key(queue text, key bytea) RETURNS bigint
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $body$ SELECT hashtextextended('conveyor.dedup:\(name):' || queue || ':' || encode(key, 'hex'), 0) $body$;
      CREATE OR REPLACE FUNCTION \(schema).order_lock_key(queue text, key text) RETURNS bigint
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $body$ SELECT hashtextextended('conveyor.order:\(name):' || queue || ':' || key, 0) $body$;
      ALTER TABLE \(schema).jobs ADD COLUMN fairness_key text, ADD COLUMN turn timestamptz,
        ADD COLUMN turn_priority integer;
      DROP INDEX \(schema).jobs_ready;
      CREATE INDEX jobs_ready ON \(schema).jobs (queue, priority DESC, (\(Self.place)), seq, id)
        WHERE status = 'ready';
      DROP INDEX \(schema).jobs_parked;
      CREATE INDEX jobs_parked ON \(schema).jobs (queue, limit_key, priority DESC, (\(Self.place)), seq, id)
        WHERE status = 'held' AND parked;
      CREATE INDEX jobs_parked_place ON \(schema).jobs (queue, priority, (\(Self.place))) WHERE status = 'held' AND parked;
      CREATE INDEX jobs_key_turns ON \(schema).jobs (queue, fairness_key, turn_priority, turn) WHERE turn IS NOT NULL;
      CREATE INDEX jobs_turns ON \(schema).jobs (queue, turn_priority, turn) WHERE turn IS NOT NULL;
      CREATE TABLE \(schema).turns_left (
        queue text NOT NULL,
        priority integer NOT NULL,
        key text NOT NULL,
        turn timestamptz NOT NULL
      );
      CREATE INDEX turns_left_key ON \(schema).turns_left (queue, priority, key, turn);
      CREATE INDEX turns_left_latest ON \(schema).turns_left (queue, priority, turn);

      \(keyStopped(create: "CREATE OR REPLACE", place: "coalesce(p.turn, p.run_at)"))

      CREATE FUNCTION \(schema).take_turn() RETURNS trigger LANGUAGE plpgsql AS $body$
      DECLARE
        head timestamptz;
        previous timestamptz;
      BEGIN
        IF NEW.turn IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.status NOT IN ('scheduled', 'dead')) THEN
          RETURN NEW;
        END IF;
        IF TG_OP = 'UPDATE' AND OLD.turn IS NOT NULL AND OLD.turn_priority IS DISTINCT FROM NEW.priority THEN
          INSERT INTO \(schema).turns_left (queue, priority, key, turn)
          VALUES (OLD.queue, OLD.turn_priority, OLD.fairness_key, OLD.turn);
        END IF;
        \(Self.turnHead(schema, queue: "NEW.queue", priority: "NEW.priority", id: "NEW.id")) INTO head;
        IF head IS NULL THEN
          \(Self.turnLatest(schema, queue: "NEW.queue", priority: "NEW.priority", runAt: "NEW.run_at")) INTO head;
        END IF;
        \(Self.turnPrevious(schema, queue: "NEW.queue", priority: "NEW.priority", key: "NEW.fairness_key"))
          INTO previous;
        NEW.turn := greatest(head, previous);
        NEW.turn_priority := NEW.priority;
        RETURN NEW;
      END
      $body$;
      CREATE FUNCTION \(schema).promote_in_order(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $body$
      DECLARE
        job bigint;
      BEGIN
        FOREACH job IN ARRAY ids LOOP
          UPDATE \(schema).jobs SET status = 'ready' WHERE id = job AND status = 'scheduled';
        END LOOP;
      END
      $body$;
      CREATE TRIGGER jobs_take_turn BEFORE INSERT OR UPDATE OF status, turn ON \(schema).jobs FOR EACH ROW
        WHEN (NEW.status = 'ready' AND NEW.fairness_key IS NOT NULL)
        EXECUTE FUNCTION \(schema).take_turn();
      """
  }

  /// The queries of ``version14``'s `take_turn`, for a job of `queue` at `priority` (SQL
  /// expressions), written once for the trigger and for the tests that explain them.
  ///
  /// The head: the place of the first job of the priority, other than `id`, that is ready
  /// (`jobs_ready`) or held by its limit key (`jobs_parked_place`); NULL with none.
  static func turnHead(_ schema: String, queue: String, priority: String, id: String) -> String {
    """
    SELECT least((
        SELECT coalesce(h.turn, h.run_at) FROM \(schema).jobs h
        WHERE h.queue = \(queue) AND h.status = 'ready' AND h.priority = \(priority) AND h.id <> \(id)
        ORDER BY h.priority DESC, coalesce(h.turn, h.run_at), h.seq, h.id LIMIT 1), (
        SELECT coalesce(h.turn, h.run_at) FROM \(schema).jobs h
        WHERE h.queue = \(queue) AND h.status = 'held' AND h.parked AND h.priority = \(priority) AND h.id <> \(id)
        ORDER BY coalesce(h.turn, h.run_at) LIMIT 1))
    """
  }
  /// With no head: the later of the run date `runAt` and the latest turn taken at the priority
  /// (`jobs_turns`, `turns_left`).
  static func turnLatest(_ schema: String, queue: String, priority: String, runAt: String) -> String {
    """
    SELECT greatest(\(runAt), (
        SELECT t.turn FROM \(schema).jobs t
        WHERE t.queue = \(queue) AND t.turn_priority = \(priority) AND t.turn IS NOT NULL
        ORDER BY t.turn DESC LIMIT 1), (
        SELECT max(l.turn) FROM \(schema).turns_left l WHERE l.queue = \(queue) AND l.priority = \(priority)))
    """
  }
  /// A millisecond after the latest turn of the fairness key `key` at the priority
  /// (`jobs_key_turns`, `turns_left`); NULL when it took none.
  static func turnPrevious(_ schema: String, queue: String, priority: String, key: String) -> String {
    """
    SELECT greatest((
        SELECT t.turn FROM \(schema).jobs t
        WHERE t.queue = \(queue) AND t.fairness_key = \(key) AND t.turn_priority = \(priority)
          AND t.turn IS NOT NULL
        ORDER BY t.turn DESC LIMIT 1), (
        SELECT max(l.turn) FROM \(schema).turns_left l
        WHERE l.queue = \(queue) AND l.priority = \(priority) AND l.key = \(key)))
      + interval '1 millisecond'
    """
  }

  /// A schedule's columns, in the order `PostgresJobStore.schedule(_:row:)` reads them.
  static let scheduleColumns = """
    queue, name, spacing, time_zone, catch_up, jitter_ms, payload, priority, time_limit_ms, origin, active, \
    paused, created_at, last_slot, next_due, dedup_key, dedup_scope, on_conflict
    """
  var schedulesOfQueue: String {
    "SELECT \(Self.scheduleColumns) FROM \(schema).schedules WHERE queue = $1 ORDER BY name COLLATE \"C\""
  }
  var schedulesOfQueueLocked: String {
    "SELECT \(Self.scheduleColumns) FROM \(schema).schedules WHERE queue = $1 ORDER BY name COLLATE \"C\" FOR UPDATE"
  }
  var allSchedules: String {
    "SELECT \(Self.scheduleColumns) FROM \(schema).schedules ORDER BY queue COLLATE \"C\", name COLLATE \"C\""
  }
  var scheduleNamedLocked: String {
    "SELECT \(Self.scheduleColumns) FROM \(schema).schedules WHERE queue = $1 AND name = $2 FOR UPDATE"
  }
  /// The due schedules of a queue, locked; one that another transaction is firing is skipped
  /// (that transaction fires it). Parameters: queue, now.
  var dueSchedules: String {
    """
    SELECT \(Self.scheduleColumns) FROM \(schema).schedules
    WHERE queue = $1 AND next_due <= $2 AND active AND NOT paused ORDER BY name COLLATE "C" FOR UPDATE SKIP LOCKED
    """
  }
  var saveSchedule: String {
    """
    INSERT INTO \(schema).schedules (\(Self.scheduleColumns))
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
    ON CONFLICT (queue, name) DO UPDATE SET spacing = EXCLUDED.spacing, time_zone = EXCLUDED.time_zone,
      catch_up = EXCLUDED.catch_up, jitter_ms = EXCLUDED.jitter_ms, payload = EXCLUDED.payload,
      priority = EXCLUDED.priority, time_limit_ms = EXCLUDED.time_limit_ms, origin = EXCLUDED.origin,
      active = EXCLUDED.active, paused = EXCLUDED.paused, created_at = EXCLUDED.created_at,
      last_slot = EXCLUDED.last_slot, next_due = EXCLUDED.next_due, dedup_key = EXCLUDED.dedup_key,
      dedup_scope = EXCLUDED.dedup_scope, on_conflict = EXCLUDED.on_conflict
    """
  }
  /// Serialises the saves of a queue's schedules: a save reads every row of the queue and writes
  /// some, and two saves must not both find a schedule missing. The lock's key holds the schema's
  /// name, so other schemas' queues of the same name never wait for it. Parameter: queue.
  var lockSchedulesOfQueue: String {
    let name = schema.filter { $0 != "\"" }
    return "SELECT pg_advisory_xact_lock(hashtextextended('conveyor.schedules:\(name):' || $1, 0))"
  }
  /// A fired schedule's new last slot and due time. Parameters: queue, name, last slot, next due.
  var advanceSchedule: String {
    "UPDATE \(schema).schedules SET last_slot = $3, next_due = $4 WHERE queue = $1 AND name = $2"
  }
  /// A schedule this build cannot read back (a newer release's), due for longer than the grace,
  /// is due again later, not never; before that it is left to the processes that can read it.
  /// Parameters: queue, name, due time, the grace's start.
  var postponeSchedule: String {
    "UPDATE \(schema).schedules SET next_due = $3 WHERE queue = $1 AND name = $2 AND next_due <= $4"
  }
  var deleteSchedule: String { "DELETE FROM \(schema).schedules WHERE queue = $1 AND name = $2" }
  var nextScheduleDue: String {
    "SELECT min(next_due) FROM \(schema).schedules WHERE queue = $1 AND active AND NOT paused"
  }
  /// The server's clock, to the millisecond.
  static let serverNow = "SELECT date_trunc('milliseconds', statement_timestamp())"

  /// The columns ``PostgresJobStore`` decodes a `JobRecord` from, in order.
  static let columns = """
    id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key, \
    lease_owner, lease_expires_at, claim_token, time_limit_ms, finished_at, errors, run_ms, output, ordering_key, \
    limit_key, parked, fairness_key
    """
  /// Where the claim's `seq` follows the record's columns, and its place (``place``) `seq`.
  static let seqColumn = 22

  /// `errors` (of the row `j`) with the text `error` appended as a JSON string, unless it is
  /// NULL, keeping the latest `JobHistory.maximumErrors`.
  static func appendError(_ error: String) -> String {
    """
    CASE WHEN \(error) IS NULL THEN j.errors
    WHEN jsonb_array_length(coalesce(j.errors, '[]')::jsonb) >= \(JobHistory.maximumErrors)
    THEN ((j.errors::jsonb - 0) || jsonb_build_array(\(error)))::text
    ELSE (coalesce(j.errors, '[]')::jsonb || jsonb_build_array(\(error)))::text END
    """
  }
  static func columns(_ table: String) -> String {
    columns.split(separator: ",").map { "\(table).\($0.trimmingCharacters(in: .whitespaces))" }
      .joined(separator: ", ")
  }

  // MARK: Enqueue

  /// Takes the deduplication locks of a batch's keys and the locks of its ordering keys' lines
  /// (see ``version9``), in one pass in lock-key order, so two enqueuers never deadlock.
  /// Parameters: queue, deduplication keys, ordering keys.
  static func lockKeys(_ schema: String) -> String {
    """
    SELECT pg_advisory_xact_lock(k) FROM (
      SELECT \(schema).dedup_lock_key($1, key) AS k FROM unnest($2::bytea[]) AS key
      UNION
      SELECT \(schema).order_lock_key($1, key) FROM unnest($3::text[]) AS key
    ) AS keys ORDER BY k
    """
  }
  /// Takes the deduplication locks of a group's keys, of any queues, in the one order
  /// ``lockKeys`` takes a single batch's in (by lock key), so a group and a lone add never
  /// deadlock. Parameters: queues, keys (pairwise), then queues, ordering keys (pairwise).
  static func lockKeysOfQueues(_ schema: String) -> String {
    """
    SELECT pg_advisory_xact_lock(k) FROM (
      SELECT \(schema).dedup_lock_key(q, key) AS k FROM unnest($1::text[], $2::bytea[]) AS t(q, key)
      UNION
      SELECT \(schema).order_lock_key(q, key) FROM unnest($3::text[], $4::text[]) AS t(q, key)
    ) AS keys ORDER BY k
    """
  }
  /// The oldest waiting job of one key. Parameters: queue, key.
  var findWaiting: String {
    """
    SELECT min(id) FROM \(schema).jobs
    WHERE queue = $1 AND dedup_key = $2 AND dedup_key IS NOT NULL AND status IN ('ready', 'scheduled', 'held')
    """
  }
  /// The oldest waiting job of one key, and the oldest that runs or that completed at or after
  /// now (`$3`, NULL: the server's clock) less `$4` milliseconds (NULL: no completed job counts),
  /// for the wider scopes. One statement, so one snapshot: a job handed back or retried by a
  /// worker meanwhile (running, then waiting) is seen in one state or the other, never missed
  /// by both looks. Parameters: queue, key, now, period.
  var findKeyed: String {
    """
    SELECT (SELECT min(id) FROM \(schema).jobs
        WHERE queue = $1 AND dedup_key = $2 AND dedup_key IS NOT NULL AND status IN ('ready', 'scheduled', 'held')),
      (SELECT min(id) FROM \(schema).jobs
        WHERE queue = $1 AND dedup_key = $2 AND dedup_key IS NOT NULL AND status IN ('running', 'completed')
          AND (status = 'running' OR finished_at >= \(Self.now(3)) - $4::int8 * interval '1 millisecond'))
    """
  }
  /// Gives the waiting job `$1` a new payload, priority, run date (as ``insertOne`` computes it)
  /// and time limit, and wakes the workers. Returns how many jobs it found waiting (and locked)
  /// and how many it updated: 0 and 0 when the job no longer waits (claimed since it was found),
  /// 1 and 0 when a trigger dropped the update. Its place, attempts and errors stay. Parameters:
  /// ID, payload, priority, delay (ms), date, now, time limit, queue.
  var replaceWaiting: String {
    """
    WITH target AS (
      SELECT id FROM \(schema).jobs WHERE id = $1 AND status IN ('ready', 'scheduled', 'held') FOR UPDATE
    ), replaced AS (
      UPDATE \(schema).jobs AS j SET payload = $2, priority = $3, run_at = r.run_at,
        status = CASE WHEN j.status = 'held' AND j.parked IS NOT TRUE THEN 'held'
          WHEN r.run_at <= n.now THEN 'ready' ELSE 'scheduled' END,
        turn = CASE WHEN j.status = 'held' AND j.parked IS NOT TRUE OR r.run_at > n.now THEN j.turn END,
        time_limit_ms = $7::int8
      FROM target AS t, (SELECT \(Self.now(6)) AS now) AS n,
        LATERAL (SELECT CASE WHEN $5::timestamptz IS NOT NULL THEN $5::timestamptz
          WHEN $4::int8 IS NOT NULL THEN least(n.now + $4::int8 * interval '1 millisecond', \(Self.latest))
          ELSE n.now END AS run_at) AS r,
        (SELECT pg_notify('\(channel)', $8)) AS wake
      WHERE j.id = t.id
      RETURNING j.id
    )
    SELECT (SELECT count(*) FROM target), (SELECT count(*) FROM replaced)
    """
  }

  /// The oldest waiting job of each key (a separate statement after the locks, so its snapshot
  /// sees every job committed by an enqueuer that held a lock before). Parameters: queue, keys.
  static func findDuplicates(_ schema: String) -> String {
    """
    SELECT dedup_key, min(id) FROM \(schema).jobs
    WHERE queue = $1 AND dedup_key = ANY($2::bytea[]) AND status IN ('ready', 'scheduled', 'held')
    GROUP BY dedup_key
    """
  }
  /// Inserts a batch in order (ascending IDs follow the ordinality), and wakes the workers (a
  /// `NOTIFY`, delivered at commit), which the insert trigger does for every other insert: it
  /// skips the store's sessions (see ``version3``). A job's run date is its date, or now plus its
  /// delay, or now. Returns the IDs, then a row with a NULL ID (the wake-up's). When a trigger of
  /// the application's dropped rows, the statement fails (`expect_inserted`), so nothing of the
  /// batch commits: it is sent alone, committing when it ends. A job with an ordering key is
  /// stored `held` when its line (``lineStatuses``) already holds a job or an earlier job of the
  /// batch has its key: the caller holds the lines' locks (``lockKeys(_:)``), taken in an earlier
  /// statement, so this one sees every job an earlier enqueuer committed. Parameters: queue,
  /// payloads, priorities, delays (ms), dates, keys, now, time limits, ordering keys, limit keys.
  static func insert(_ schema: String, channel: String) -> String {
    """
    WITH inserted AS (
      INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at, dedup_key, time_limit_ms,
        ordering_key, limit_key, fairness_key)
      SELECT $1, j.payload,
        CASE WHEN j.line IS NOT NULL AND (j.place > 1 OR EXISTS (
            SELECT 1 FROM \(schema).jobs l
            WHERE l.queue = $1 AND l.ordering_key = j.line AND l.status IN (\(lineStatuses))))
          THEN 'held' WHEN r.run_at <= n.now THEN 'ready' ELSE 'scheduled' END,
        j.priority, r.run_at, n.now, j.key, j.time_limit, j.line, j.limit_key, j.fairness_key
      FROM (SELECT \(Self.now(7)) AS now) AS n,
        (SELECT u.*, row_number() OVER (PARTITION BY u.line ORDER BY u.ordinal) AS place
          FROM unnest(
            $2::bytea[], $3::int8[], $4::int8[], $5::timestamptz[], $6::bytea[], $8::int8[], $9::text[], $10::text[],
            $11::text[])
            WITH ORDINALITY AS u(payload, priority, delay, at, key, time_limit, line, limit_key, fairness_key, ordinal))
          AS j,
        LATERAL (SELECT CASE WHEN j.at IS NOT NULL THEN j.at
          WHEN j.delay IS NOT NULL THEN least(n.now + j.delay * interval '1 millisecond', \(Self.latest))
          ELSE n.now END AS run_at) AS r
      ORDER BY j.ordinal
      RETURNING id
    )
    \(insertedAndWake(schema, channel: channel))
    """
  }

  /// The end of both batch inserts: the IDs of the rows `inserted` (a CTE) holds, then a row with
  /// a NULL ID from the check that no trigger dropped a row of the `$2` payloads and the wake-up
  /// of queue `$1`.
  private static func insertedAndWake(_ schema: String, channel: String) -> String {
    """
    SELECT id FROM inserted
    UNION ALL SELECT NULL FROM (
      SELECT \(schema).expect_inserted((SELECT count(*) FROM inserted), cardinality($2::bytea[])),
        pg_notify('\(channel)', $1)
    ) AS wake
    """
  }

  /// Inserts a batch of jobs that share their priority and run time and have no deduplication key
  /// (what `JobQueue.add` of several items sends), as ``insert(_:channel:)`` does, with one array:
  /// the payloads. Returns the IDs and a NULL row. Parameters: queue, payloads, priority, delay
  /// (ms), date, now.
  static func insertUniform(_ schema: String, channel: String) -> String {
    """
    WITH inserted AS (
      INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at, time_limit_ms)
      SELECT $1, j.payload, CASE WHEN r.run_at <= n.now THEN 'ready' ELSE 'scheduled' END, $3, r.run_at, n.now,
        $7::int8
      FROM (SELECT \(Self.now(6)) AS now) AS n,
        LATERAL (SELECT CASE WHEN $5::timestamptz IS NOT NULL THEN $5::timestamptz
          WHEN $4::int8 IS NOT NULL THEN least(n.now + $4::int8 * interval '1 millisecond', \(Self.latest))
          ELSE n.now END AS run_at) AS r,
        unnest($2::bytea[]) WITH ORDINALITY AS j(payload, ordinal)
      ORDER BY j.ordinal
      RETURNING id
    )
    \(insertedAndWake(schema, channel: channel))
    """
  }

  /// Inserts one job and wakes the workers, as ``insert(_:channel:)`` does for a batch, with
  /// scalar parameters: the commonest add, at about half the server's time of the batch
  /// statement. Returns the ID. Parameters: queue, payload, priority, delay (ms), date, key, now.
  static func insertOne(_ schema: String, channel: String) -> String {
    """
    INSERT INTO \(schema).jobs (queue, payload, status, priority, run_at, created_at, dedup_key, time_limit_ms)
    SELECT $1, $2, CASE WHEN r.run_at <= n.now THEN 'ready' ELSE 'scheduled' END, $3, r.run_at, n.now, $6, $8::int8
    FROM (SELECT \(Self.now(7)) AS now) AS n,
      LATERAL (SELECT CASE WHEN $5::timestamptz IS NOT NULL THEN $5::timestamptz
        WHEN $4::int8 IS NOT NULL THEN least(n.now + $4::int8 * interval '1 millisecond', \(Self.latest))
        ELSE n.now END AS run_at) AS r,
      (SELECT pg_notify('\(channel)', $1)) AS wake
    RETURNING id
    """
  }

  // MARK: Settling and claiming

  /// The current claims among `(id, token)` pairs (a relation `s` with those columns), each locked
  /// (`FOR UPDATE`): running, in queue `$queueParameter`, with that claim token. For settling and
  /// heartbeats, which then change the locked rows by ID.
  ///
  /// Each pair is one primary-key lookup, whatever the plan: the lookup is a `LATERAL` subquery
  /// kept apart from the rest of the plan (`OFFSET 0`), so the pairs always drive it. Joined the
  /// usual way, a plan that took the table for small (statistics taken before the queue grew)
  /// walked the whole primary key, and one that took the pairs for few scanned all of them for
  /// every job. The status and queue are written so no index can serve them (`|| ''` leaves each
  /// value as it is): with statistics taken before the workers claimed, the planner otherwise
  /// walked every running job of the queue for each pair.
  static func currentClaims(_ schema: String, queueParameter: Int) -> String {
    """
    CROSS JOIN LATERAL (
      SELECT 1 FROM \(schema).jobs j
      WHERE j.id = s.id AND j.claim_token = s.token AND j.status || '' = 'running'
        AND j.queue || '' = $\(queueParameter)
      OFFSET 0 FOR UPDATE
    ) AS current
    """
  }

  /// The CTE `lines` of a settlement: when some of its jobs left their lines (`after`, a relation
  /// with columns `q`, the queue, and `line`, the ordering key of a job that left its line, else
  /// NULL), ``version9``'s `promote_lines` locks those lines and promotes the next job of each.
  /// The statement must read `lines` (`… UNION ALL SELECT … FROM lines WHERE promoted < 0`, which
  /// returns no row), which reads `after` to its end first: the function's statements, a new
  /// snapshot each, then see every row the statement changed. A batch without keyed jobs
  /// aggregates its rows and calls nothing.
  static func promoteLines(_ schema: String, after relation: String) -> String {
    """
    lines AS (
      SELECT \(schema).promote_lines(array_agg(q), array_agg(line)) AS promoted FROM \(relation)
      WHERE line IS NOT NULL HAVING count(*) > 0
    )
    """
  }

  /// Applies a batch of settlements in one statement; returns the claims that applied (ID and
  /// token), each with the run date a retry set (NULL for the other kinds).
  /// Kinds: 0 complete, 1 retry (delay in ms), 2 kill, 3 release, 4 complete and delete, 5 kill
  /// and delete (no history kept), 6 kill leaving the job's ordering key (cleared; the next job of
  /// the key is promoted, as for a completion). Each applies only while its claim is current: running, with
  /// the same claim token (``currentClaims(_:queueParameter:)`` finds and locks those, then the
  /// rows are deleted or changed by ID).
  /// Parameters: ids, tokens, kinds, delays, errors, now, queue, run times (ms), outputs.
  static func settle(_ schema: String) -> String {
    """
    WITH n AS (SELECT \(Self.now(6)) AS now),
    s AS (
      SELECT * FROM unnest($1::int8[], $2::int8[], $3::int4[], $4::int8[], $5::text[], $8::int8[], $9::bytea[])
        WITH ORDINALITY AS s(id, token, kind, delay, error, ran, output, ord)
    ),
    c AS MATERIALIZED (
      SELECT s.id, s.kind, s.delay, s.error, s.ran, s.output, s.ord
      FROM s \(Self.currentClaims(schema, queueParameter: 7))
    ),
    r AS MATERIALIZED (
      SELECT c.id, row_number() OVER (ORDER BY c.ord) AS place FROM c, n
      WHERE c.kind = 1 AND least(n.now + c.delay * interval '1 millisecond', \(Self.latest)) <= n.now
    ),
    bump AS (
      INSERT INTO \(schema).queues (name, retry_seq) SELECT $7, count(*) FROM r HAVING count(*) > 0
      ON CONFLICT (name) DO UPDATE SET retry_seq = queues.retry_seq + excluded.retry_seq
      RETURNING retry_seq
    ),
    done AS (
      DELETE FROM \(schema).jobs j WHERE j.id = ANY(ARRAY(SELECT id FROM c WHERE kind IN (4, 5)))
      RETURNING j.id, j.claim_token, NULL::timestamptz AS retry_at, j.queue AS q, j.ordering_key AS line
    ),
    released AS MATERIALIZED (
      SELECT j.id, j.ordering_key AS key FROM \(schema).jobs j WHERE j.id = ANY(ARRAY(SELECT id FROM c WHERE kind = 6))
    ),
    changed AS (
      UPDATE \(schema).jobs j SET
        status = CASE c.kind WHEN 0 THEN 'completed' WHEN 2 THEN 'dead' WHEN 6 THEN 'dead' WHEN 3 THEN 'ready'
          ELSE CASE WHEN least(n.now + c.delay * interval '1 millisecond', \(Self.latest)) <= n.now
            THEN 'ready' ELSE 'scheduled' END END,
        ordering_key = CASE WHEN c.kind = 6 THEN NULL ELSE j.ordering_key END,
        turn = CASE WHEN r.place IS NOT NULL THEN NULL ELSE j.turn END,
        finished_at = CASE WHEN c.kind IN (0, 2, 6) THEN n.now ELSE j.finished_at END,
        errors = CASE WHEN c.kind IN (1, 2, 6) THEN \(appendError("c.error")) ELSE j.errors END,
        run_ms = coalesce(c.ran, j.run_ms),
        output = CASE WHEN c.kind = 0 THEN c.output ELSE j.output END,
        run_at = CASE WHEN c.kind = 1
          THEN least(n.now + c.delay * interval '1 millisecond', \(Self.latest)) ELSE j.run_at END,
        seq = CASE WHEN c.kind <> 1 THEN j.seq WHEN r.place IS NULL THEN 0
          ELSE (SELECT retry_seq FROM bump) - (SELECT count(*) FROM r) + r.place END,
        attempts = CASE WHEN c.kind = 3 THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
        last_error = CASE WHEN c.kind IN (2, 6) THEN c.error ELSE coalesce(c.error, j.last_error) END,
        lease_owner = NULL, lease_expires_at = NULL
      FROM c LEFT JOIN r ON r.id = c.id LEFT JOIN released ON released.id = c.id, n
      WHERE j.id = ANY(ARRAY(SELECT id FROM c WHERE kind < 4 OR kind = 6)) AND c.id = j.id
      RETURNING j.id, j.claim_token, CASE WHEN c.kind = 1 THEN j.run_at END AS retry_at, j.queue AS q,
        CASE WHEN c.kind = 0 THEN j.ordering_key WHEN c.kind = 6 THEN released.key END AS line
    ),
    \(promoteLines(schema, after: "(SELECT q, line FROM done UNION ALL SELECT q, line FROM changed) AS left_lines"))
    SELECT id, claim_token, retry_at FROM done UNION ALL SELECT id, claim_token, retry_at FROM changed
    UNION ALL SELECT NULL, NULL, NULL FROM lines WHERE promoted < 0
    """
  }

  /// Completes the current claims among completions, the usual batch of settlements, keeping
  /// them as history; returns the claims that applied (ID and token). The same rule as
  /// ``settle``'s, with a smaller plan (no retry places, no union). Parameters: ids, tokens,
  /// queue, run times (ms), outputs, now.
  static func complete(_ schema: String) -> String {
    """
    WITH done AS (
      UPDATE \(schema).jobs j SET status = 'completed', finished_at = \(Self.now(6)),
        run_ms = coalesce(c.ran, j.run_ms), output = c.output, lease_owner = NULL, lease_expires_at = NULL
      FROM (
        SELECT s.id, s.ran, s.output FROM unnest($1::int8[], $2::int8[], $4::int8[], $5::bytea[])
          AS s(id, token, ran, output) \(currentClaims(schema, queueParameter: 3))
      ) AS c
      WHERE j.id = c.id
      RETURNING j.id, j.claim_token, j.queue AS q, j.ordering_key AS line
    ),
    \(promoteLines(schema, after: "done"))
    SELECT id, claim_token FROM done UNION ALL SELECT NULL, NULL FROM lines WHERE promoted < 0
    """
  }

  /// Deletes the current claims among completions whose queue keeps no history of completed
  /// jobs; returns the claims that applied (ID and token). Parameters: ids, tokens, queue.
  static func completeWithoutHistory(_ schema: String) -> String {
    """
    WITH done AS (
      DELETE FROM \(schema).jobs j WHERE j.id = ANY(ARRAY(
        SELECT s.id FROM unnest($1::int8[], $2::int8[]) AS s(id, token) \(currentClaims(schema, queueParameter: 3))))
      RETURNING j.id, j.claim_token, j.queue AS q, j.ordering_key AS line
    ),
    \(promoteLines(schema, after: "done"))
    SELECT id, claim_token FROM done UNION ALL SELECT NULL, NULL FROM lines WHERE promoted < 0
    """
  }

  /// Promotes the scheduled jobs that fell due (skipping rows another worker is promoting) and
  /// reads the pause flag. Parameters: queue, now.
  ///
  /// The due IDs are collected into an array first (`id = ANY(ARRAY(…))`): the planner cannot
  /// know how many jobs are due (the time is a parameter or the statement's clock), and with
  /// `id IN (…)` it guessed thousands and joined them against a sequential scan of the table; an
  /// array is always looked up by the primary key. The rescue is written the same way.
  ///
  /// Jobs with a fairness key take their turns as they become ready, each seeing the ones before
  /// (``version14``), and one `UPDATE` reaches its rows in an order of the plan's choosing: when
  /// a job with a fairness key is among the due, `promote_in_order` makes them ready one at a
  /// time in ID order, the order the other stores take.
  static func promote(_ schema: String) -> String {
    """
    WITH due AS MATERIALIZED (
      SELECT id, fairness_key IS NOT NULL AS fair FROM \(schema).jobs
      WHERE queue = $1 AND status = 'scheduled' AND run_at <= \(Self.now(2))
      FOR UPDATE SKIP LOCKED
    ),
    promoted AS (
      UPDATE \(schema).jobs SET status = 'ready' WHERE id = ANY(ARRAY(SELECT id FROM due))
        AND NOT EXISTS (SELECT 1 FROM due WHERE fair)
    ),
    in_order AS (
      SELECT \(schema).promote_in_order(ARRAY(SELECT id FROM due ORDER BY id)) AS done
      WHERE EXISTS (SELECT 1 FROM due WHERE fair)
    )
    SELECT coalesce((SELECT paused FROM \(schema).queues WHERE name = $1), false),
      (SELECT concurrency FROM \(schema).queues WHERE name = $1), (SELECT count(*) FROM in_order)
    """
  }

  /// Claims up to `limit` ready jobs in claim order, skipping rows other workers hold, and none
  /// while the queue is paused: the subquery locks them (`FOR UPDATE SKIP LOCKED`) once, then the
  /// update marks them running. The lease is computed from the statement's time. `RETURNING`
  /// gives the rows in no particular order, so it returns each row's `seq` after the record's
  /// columns, and the store sorts them. Parameters: queue, limit, owner, lease (ms), now.
  ///
  /// The picked IDs are looked up as an array (`id = ANY(ARRAY(…))`), as in ``promote``: a plan
  /// made without the limit's value (a prepared statement's generic plan) guessed a tenth of the
  /// queue and merge-joined it against the whole primary key.
  static func claim(_ schema: String) -> String {
    """
    UPDATE \(schema).jobs j SET status = 'running',
      attempts = CASE WHEN j.attempts < 9223372036854775807 THEN j.attempts + 1 ELSE j.attempts END,
      claim_token = j.claim_token + 1, lease_owner = $3,
      lease_expires_at = least(\(Self.now(5)) + $4 * interval '1 millisecond', \(Self.latest))
    WHERE j.id = ANY(ARRAY(
      SELECT id FROM \(schema).jobs WHERE queue = $1 AND status = 'ready'
        AND NOT EXISTS (SELECT 1 FROM \(schema).queues q WHERE q.name = $1 AND q.paused)
        AND current_setting('\(Self.limitLocked)', true) IS DISTINCT FROM 'on'
      ORDER BY priority DESC, \(Self.place), seq, id LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING \(Self.columns("j")), j.seq, coalesce(j.turn, j.run_at)
    """
  }

  /// After the claims, in the same transaction and only when ``limitLock`` took the lock: whether
  /// the queue's running jobs (this claim's among them) fill its concurrency limit, and, when its
  /// rate bucket is empty, its next start and the time it was read at (microseconds since 1970;
  /// NULL otherwise). No row when the lock was not taken. Parameters: queue, now (microseconds,
  /// as ``limitedClaim``'s `$6`).
  static func limitFull(_ schema: String) -> String {
    """
    SELECT CASE WHEN q.concurrency IS NULL THEN false ELSE q.concurrency <= \(runningUpToLimit(schema)) END,
      b.base - b.slack, b.now_us
    FROM \(schema).queues q
    LEFT JOIN (\(rateBucket(schema, now: Self.microsUnderLock(2)))) AS b ON b.base - b.slack > b.now_us
    WHERE q.name = $1 AND (q.concurrency IS NOT NULL OR q.rate IS NOT NULL OR \(hasKeyLimits(schema, row: "q")))
      AND current_setting('\(limitLocked)', true) = 'on'
    """
  }

  /// The queue's running jobs counted up to its concurrency limit, for a statement with the
  /// queue's row as `q` (and the queue as `$1`): no more than the limit's worth of `jobs_status`
  /// entries, however many run (a limit lowered far below them, or lapsed leases not yet
  /// rescued). All of them when the queue has no limit.
  static func runningUpToLimit(_ schema: String) -> String {
    """
    (SELECT count(*) FROM (
      SELECT 1 FROM \(schema).jobs r WHERE r.queue = $1 AND r.status = 'running' LIMIT q.concurrency) AS running)
    """
  }

  /// The key of the limit lock of the queue `queue` (an SQL expression) in `schema` (quoted): the
  /// schema's name and the queue's, so queues of the same name in two schemas of one database do
  /// not wait for each other (they did before schema 11, whose builds take this key).
  static func limitLockKey(_ schema: String, queue: String) -> String {
    let name = schema.filter { $0 != "\"" }
    return "hashtextextended('conveyor.limit:\(name):' || \(queue), 0)"
  }

  /// The transaction-local setting where ``limitLock`` leaves how long the claim was delayed, in
  /// microseconds: the time its transaction ran before the statement when that was at least `$2`
  /// microseconds (NULL: never counted), plus the wait for the lock: 0 when it was free
  /// (`pg_try_advisory_xact_lock`), else the time from just before the waiting
  /// `pg_advisory_xact_lock` to just after it. A rate counts a claim's start from then (see
  /// ``microsUnderLock(_:)``), and a claim that was not delayed is counted at the caller's time
  /// exactly, however loaded the server.
  static let limitWaited = "conveyor.limit_waited_us"
  /// The server's clock now (not the statement's start), in microseconds since 1970.
  static let clockMicros = "(extract(epoch FROM clock_timestamp()) * 1000000)::int8"

  /// The transaction-local setting ``limitLock`` turns `on` when it took the lock: ``claim``
  /// then claims nothing and ``limitedClaim`` claims; otherwise the reverse.
  static let limitLocked = "conveyor.limit_locked"
  /// The transaction-local setting ``limitLock`` turns `on` when the queue has limits per key:
  /// ``keyLimitedClaim`` then claims, and ``limitedClaim`` claims nothing.
  static let keyLimited = "conveyor.key_limited"
  /// Whether the queue `$1` (its row in the statement as `q`, or the table `queues`) has limits per
  /// key.
  static func hasKeyLimits(_ schema: String, row: String) -> String {
    "(\(row).key_concurrency IS NOT NULL OR EXISTS (SELECT 1 FROM \(schema).key_limits k WHERE k.queue = \(row).name) "
      + "OR \(hasKeyRates(schema, row: row)))"
  }
  /// Whether the queue (its row `row`) has rates per key.
  static func hasKeyRates(_ schema: String, row: String) -> String {
    "(\(row).key_rate IS NOT NULL OR EXISTS (SELECT 1 FROM \(schema).key_rates r WHERE r.queue = \(row).name))"
  }
  /// The transaction-local setting ``limitLock`` turns `on` when the queue has rates per key:
  /// ``releaseDueKeys`` then runs.
  static let keyRated = "conveyor.key_rated"

  /// Serializes the claims of a queue with a concurrency or rate limit, in the claim's transaction:
  /// when the queue has a limit, takes the queue's limit lock (waiting for the claim that holds it to
  /// commit) and sets ``limitLocked``. The next statement, ``claim`` or ``limitedClaim``, runs
  /// in a snapshot taken after the lock was granted, so it sees every claim committed before.
  /// A limit stored after this statement read the queue's row does not bind this claim: the
  /// claim counts as made before the limit was stored (as when a limit is lowered below the
  /// running jobs). The lock's key holds the schema's name and the queue's (``limitLockKey``).
  /// Parameters: queue, the shortest delay before the lock counted (microseconds; NULL: never).
  static func limitLock(_ schema: String) -> String {
    """
    SELECT set_config('\(limitWaited)', (
        (SELECT CASE WHEN d.before >= $2 THEN d.before ELSE 0 END
          FROM (SELECT \(clockMicros) - (extract(epoch FROM transaction_timestamp()) * 1000000)::int8 AS before) AS d)
        + CASE WHEN pg_try_advisory_xact_lock(\(limitLockKey(schema, queue: "$1"))) THEN 0
          ELSE (SELECT \(clockMicros) - w.started FROM (
            SELECT \(clockMicros) AS started, pg_advisory_xact_lock(\(limitLockKey(schema, queue: "$1")))) AS w)
          END)::text, true),
      set_config('\(limitLocked)', 'on', true),
      set_config('\(keyLimited)', CASE WHEN \(hasKeyLimits(schema, row: "queues")) THEN 'on' ELSE 'off' END, true),
      set_config('\(keyRated)', CASE WHEN \(hasKeyRates(schema, row: "queues")) THEN 'on' ELSE 'off' END, true)
    FROM \(schema).queues WHERE name = $1
      AND (concurrency IS NOT NULL OR rate IS NOT NULL OR \(hasKeyLimits(schema, row: "queues")))
    """
  }

  /// ``claim`` for a queue with a concurrency limit, run after ``limitLock`` in the same
  /// transaction, and only when that took the lock (``limitLocked``; the claim of a queue without
  /// a limit stops at its one-time filter): it takes no more than the limit less the running jobs
  /// (as many as asked when the limit was removed meanwhile). The running jobs are counted from
  /// `jobs_status`, at most the limit's worth. The candidates are picked as ``claim`` picks them
  /// (`LIMIT $2`, which the planner reads as few rows: a `LIMIT` computed from the count was
  /// planned for many and made the drain a quarter slower), then cut to the places left; the
  /// candidates left over stay locked until the claim commits (this queue's other claims wait
  /// for its lock anyway; a cancel or removal of one of them waits for that commit). Parameters
  /// as ``claim``'s. With the caller's clock (`$5`), the lease also gains the time the
  /// transaction ran before this statement, which is mostly the wait for the limit's lock: the
  /// lease runs from the claim under the lock, as ``claim``'s does from its statement.
  ///
  /// Under a rate limit it also takes no more than the starts the bucket holds (``rateBucket``),
  /// and stores the bucket's time after the starts it took, in the same statement (also when it
  /// took none but cut back a time a clock stepped back left too far ahead: see `RateLimit.take`).
  static func limitedClaim(_ schema: String) -> String {
    let underLock = "$5::timestamptz + (clock_timestamp() - transaction_timestamp())"
    return """
      WITH bucket AS (\(rateBucket(schema, now: Self.microsUnderLock(6)))),
      claimed AS (
        UPDATE \(schema).jobs j SET status = 'running',
          attempts = CASE WHEN j.attempts < 9223372036854775807 THEN j.attempts + 1 ELSE j.attempts END,
          claim_token = j.claim_token + 1, lease_owner = $3,
          lease_expires_at = least(
            coalesce(date_trunc('milliseconds', \(underLock)), date_trunc('milliseconds', statement_timestamp()))
              + $4 * interval '1 millisecond', \(Self.latest))
        WHERE j.id = ANY(ARRAY(
          SELECT id FROM (
            SELECT id, priority, \(Self.place) AS place, seq FROM \(schema).jobs WHERE queue = $1 AND status = 'ready'
              AND NOT EXISTS (SELECT 1 FROM \(schema).queues q WHERE q.name = $1 AND q.paused)
              AND current_setting('\(Self.limitLocked)', true) = 'on'
              AND current_setting('\(Self.keyLimited)', true) IS DISTINCT FROM 'on'
            ORDER BY priority DESC, \(Self.place), seq, id LIMIT $2 FOR UPDATE SKIP LOCKED
          ) AS candidates
          ORDER BY priority DESC, place, seq, id
          LIMIT greatest(0, least($2,
            coalesce(
              (SELECT q.concurrency - \(runningUpToLimit(schema)) FROM \(schema).queues q
                WHERE q.name = $1 AND q.concurrency IS NOT NULL), $2),
            coalesce((SELECT starts FROM bucket), $2)))))
        RETURNING \(Self.columns("j")), j.seq, coalesce(j.turn, j.run_at)
      ),
      timed AS (
        UPDATE \(schema).queues SET rate_time = (SELECT b.base + (SELECT count(*) FROM claimed) * b.step FROM bucket b)
        WHERE name = $1 AND rate IS NOT NULL AND EXISTS (
          SELECT 1 FROM bucket b
          WHERE EXISTS (SELECT 1 FROM claimed) OR queues.rate_time > b.now_us + b.slack + b.step)
      )
      SELECT * FROM claimed
      """
  }

  /// How far past the jobs it may take a claim under limits per key reads (and parks) ready jobs:
  /// each row read is locked, so a wide window cost every claim (a window of 256 made a drain
  /// over 100 keys five times slower); a claim that finds fewer claimable jobs than it wants after
  /// holding some is followed at once by another (its next wake is due).
  static let keyWindow = 8

  /// ``limitedClaim`` for a queue with limits per key (``version12``), run after ``limitLock``
  /// and only when that found limits per key (``keyLimited``): of the first `$2 +`
  /// ``keyWindow`` ready jobs (locked), it takes at most as many of each limit key as the key's
  /// limit less its running jobs (counted from `jobs_key_running`, at most the limit's worth),
  /// within the queue's own limits (concurrency, rate) and `$2`. Once a key's places are all
  /// taken (or there were none), its other jobs read here are parked: `held` and `parked`, out of
  /// the claim index, until a job of the key stops running (``version12``'s `key_stopped`) or the
  /// limits are set again. A key whose places were not all taken (the claim was cut by `$2` or the
  /// queue's limits first) parks nothing, so a parked job's key always has running jobs whose end
  /// makes it ready. Parameters as ``limitedClaim``'s.
  static func keyLimitedClaim(_ schema: String) -> String {
    let underLock = "$5::timestamptz + (clock_timestamp() - transaction_timestamp())"
    return """
      WITH bucket AS (\(rateBucket(schema, now: Self.microsUnderLock(6)))),
      candidates AS MATERIALIZED (
        SELECT id, priority, \(Self.place) AS place, seq, limit_key FROM \(schema).jobs WHERE queue = $1 AND status = 'ready'
          AND NOT EXISTS (SELECT 1 FROM \(schema).queues q WHERE q.name = $1 AND q.paused)
          AND current_setting('\(Self.keyLimited)', true) = 'on'
        ORDER BY priority DESC, \(Self.place), seq, id LIMIT $2 + \(keyWindow) FOR UPDATE SKIP LOCKED
      ),
      keys AS MATERIALIZED (
        SELECT d.limit_key, coalesce(o.concurrency, q.key_concurrency) AS bound,
          coalesce(kr.rate, q.key_rate) AS rate, CASE WHEN kr.rate IS NOT NULL THEN kr.burst ELSE q.key_burst END AS burst,
          kb.tat
        FROM (SELECT DISTINCT limit_key FROM candidates WHERE limit_key IS NOT NULL) AS d
        CROSS JOIN (SELECT key_concurrency, key_rate, key_burst FROM \(schema).queues WHERE name = $1) AS q
        LEFT JOIN \(schema).key_limits o ON o.queue = $1 AND o.key = d.limit_key
        LEFT JOIN \(schema).key_rates kr ON kr.queue = $1 AND kr.key = d.limit_key
        LEFT JOIN \(schema).key_buckets kb ON kb.queue = $1 AND kb.key = d.limit_key
      ),
      key_bucket AS MATERIALIZED (
        \(keyBuckets(from: "keys", key: "limit_key", now: Self.microsUnderLock(6)))
      ),
      bounds AS MATERIALIZED (
        SELECT k.limit_key, least(
            CASE WHEN k.bound IS NOT NULL THEN k.bound - (
              SELECT count(*) FROM (
                SELECT 1 FROM \(schema).jobs r
                WHERE r.queue = $1 AND r.limit_key = k.limit_key AND r.status = 'running' AND r.limit_key IS NOT NULL
                LIMIT k.bound) AS running) END,
            kb.starts) AS free
        FROM keys k LEFT JOIN key_bucket kb ON kb.limit_key = k.limit_key
        WHERE k.bound IS NOT NULL OR kb.starts IS NOT NULL
      ),
      ranked AS MATERIALIZED (
        SELECT c.id, c.priority, c.place, c.seq, c.limit_key, b.free,
          row_number() OVER (PARTITION BY c.limit_key ORDER BY c.priority DESC, c.place, c.seq, c.id) AS nth
        FROM candidates c LEFT JOIN bounds b ON b.limit_key = c.limit_key
      ),
      taken AS MATERIALIZED (
        SELECT id, limit_key FROM ranked WHERE free IS NULL OR nth <= free
        ORDER BY priority DESC, place, seq, id
        LIMIT greatest(0, least($2,
          coalesce(
            (SELECT q.concurrency - \(runningUpToLimit(schema)) FROM \(schema).queues q
              WHERE q.name = $1 AND q.concurrency IS NOT NULL), $2),
          coalesce((SELECT starts FROM bucket), $2)))
      ),
      to_park AS MATERIALIZED (
        SELECT r.id, r.limit_key FROM ranked r
        WHERE r.free IS NOT NULL AND r.nth > r.free
          AND (SELECT count(*) FROM taken t WHERE t.limit_key = r.limit_key) >= r.free
      ),
      parked AS (
        UPDATE \(schema).jobs j SET status = 'held', parked = true FROM to_park p WHERE j.id = p.id
      ),
      key_timed AS (
        INSERT INTO \(schema).key_buckets AS b (queue, key, tat, due, due_set)
        SELECT $1, kb.limit_key, kb.base + c.n * kb.step, d.due, CASE WHEN d.due IS NOT NULL THEN kb.now_us END
        FROM key_bucket kb
        CROSS JOIN LATERAL (SELECT count(*) AS n FROM taken t WHERE t.limit_key = kb.limit_key) AS c
        CROSS JOIN LATERAL (
          SELECT CASE WHEN c.n >= kb.starts AND EXISTS (SELECT 1 FROM to_park p WHERE p.limit_key = kb.limit_key)
            THEN kb.base + c.n * kb.step - kb.slack END AS due) AS d
        WHERE c.n > 0 OR kb.tat > kb.now_us + kb.slack + kb.step
          OR EXISTS (SELECT 1 FROM to_park p WHERE p.limit_key = kb.limit_key)
        ON CONFLICT (queue, key) DO UPDATE SET tat = excluded.tat,
          due_set = CASE WHEN excluded.due IS NULL THEN b.due_set
            WHEN b.due IS NULL OR excluded.due < b.due OR b.due_set > excluded.due_set THEN excluded.due_set
            ELSE b.due_set END,
          due = CASE WHEN excluded.due IS NULL THEN b.due
            WHEN b.due IS NULL OR excluded.due < b.due OR b.due_set > excluded.due_set THEN excluded.due
            ELSE b.due END
      ),
      claimed AS (
        UPDATE \(schema).jobs j SET status = 'running',
          attempts = CASE WHEN j.attempts < 9223372036854775807 THEN j.attempts + 1 ELSE j.attempts END,
          claim_token = j.claim_token + 1, lease_owner = $3,
          lease_expires_at = least(
            coalesce(date_trunc('milliseconds', \(underLock)), date_trunc('milliseconds', statement_timestamp()))
              + $4 * interval '1 millisecond', \(Self.latest))
        WHERE j.id = ANY(ARRAY(SELECT id FROM taken))
        RETURNING \(Self.columns("j")), j.seq, coalesce(j.turn, j.run_at)
      ),
      timed AS (
        UPDATE \(schema).queues SET rate_time = (SELECT b.base + (SELECT count(*) FROM claimed) * b.step FROM bucket b)
        WHERE name = $1 AND rate IS NOT NULL AND EXISTS (
          SELECT 1 FROM bucket b
          WHERE EXISTS (SELECT 1 FROM claimed) OR queues.rate_time > b.now_us + b.slack + b.step)
      )
      SELECT * FROM claimed
      """
  }

  /// The buckets of the limit keys in `from` (a CTE with columns `key`, `rate`, `burst`, `tat`)
  /// that have a rate, at `now` (microseconds since 1970): `key`, `tat` (stored), `now_us`,
  /// `step`, `slack`, `base` and `starts`, as ``rateBucket`` computes a queue's (the arithmetic of
  /// `RateLimit.take`).
  static func keyBuckets(from: String, key: String, now: String) -> String {
    """
    SELECT x.\(key), x.tat, x.now_us, x.step, x.slack, x.base,
      CASE WHEN x.now_us + x.slack < x.base THEN 0 ELSE (x.now_us + x.slack - x.base) / x.step + 1 END AS starts
    FROM (
      SELECT f.\(key), f.tat, n.now_us, s.step, s.slack,
        greatest(least(coalesce(f.tat, n.now_us), n.now_us + s.slack + s.step), n.now_us) AS base
      FROM \(from) f
      CROSS JOIN (SELECT \(now) AS now_us) AS n
      CROSS JOIN LATERAL (
        SELECT greatest(1, ceil(1000000 / f.rate))::int8 AS step,
          (f.burst - 1)::int8 * greatest(1, ceil(1000000 / f.rate))::int8 AS slack) AS s
      WHERE f.rate IS NOT NULL
    ) AS x
    """
  }

  /// In a claim of a queue with rates per key, after ``limitLock`` and before ``keyLimitedClaim``
  /// (only when the queue has rates per key, ``keyRated``): makes ready the jobs held by keys
  /// whose rate gives starts again by now, as many of each key's, in claim order, as its bucket
  /// gives (at least one; the claim holds again any still over a limit), and those of keys whose
  /// due time a later clock noted (the clock stepped back since). A key with more held (a held job
  /// another transaction has locked among them) is due again when its bucket gives the start after
  /// those. At most ``maximumKeysReleased`` keys a claim; a key left is still due, so the queue's
  /// next wake is now. Up to 16 buckets full for a day and holding nothing are deleted (as good as
  /// no row). Parameters: queue, now in microseconds (NULL: the server's).
  /// The most keys whose held jobs one claim makes ready (`QueueLimits` documents it).
  static let maximumKeysReleased = 1_000

  static func releaseDueKeys(_ schema: String) -> String {
    let now = Self.microsUnderLock(2)
    return """
      WITH due AS MATERIALIZED (
        SELECT b.key, b.tat, coalesce(kr.rate, q.key_rate) AS rate,
          CASE WHEN kr.rate IS NOT NULL THEN kr.burst ELSE q.key_burst END AS burst
        FROM \(schema).key_buckets b
        JOIN \(schema).queues q ON q.name = $1
        LEFT JOIN \(schema).key_rates kr ON kr.queue = $1 AND kr.key = b.key
        WHERE b.queue = $1 AND b.due IS NOT NULL AND (b.due <= \(now) OR b.due_set > \(now))
          AND current_setting('\(keyRated)', true) = 'on'
        LIMIT \(maximumKeysReleased)
      ),
      bucket AS MATERIALIZED (\(keyBuckets(from: "due", key: "key", now: now))),
      counted AS MATERIALIZED (
        SELECT d.key, greatest(1, coalesce(k.starts, 1)) AS n, k.base, k.step, k.slack, k.now_us
        FROM due d LEFT JOIN bucket k ON k.key = d.key
      ),
      unparked AS (
        UPDATE \(schema).jobs SET status = 'ready', parked = NULL WHERE id = ANY(ARRAY(
          SELECT p.id FROM counted c CROSS JOIN LATERAL (
            SELECT id FROM \(schema).jobs
            WHERE queue = $1 AND limit_key = c.key AND status = 'held' AND parked
            ORDER BY priority DESC, \(Self.place), seq, id LIMIT c.n FOR UPDATE SKIP LOCKED) AS p))
        RETURNING limit_key
      ),
      rescheduled AS (
        UPDATE \(schema).key_buckets b SET due = r.due, due_set = CASE WHEN r.due IS NOT NULL THEN c.now_us END
        FROM counted c CROSS JOIN LATERAL (
          SELECT CASE
            WHEN c.base IS NOT NULL AND (
              SELECT count(*) FROM (
                SELECT 1 FROM \(schema).jobs
                WHERE queue = $1 AND limit_key = c.key AND status = 'held' AND parked LIMIT c.n + 1) AS m)
              > (SELECT count(*) FROM unparked u WHERE u.limit_key = c.key)
            THEN greatest(c.now_us + 1, c.base + c.n * c.step - c.slack) END AS due) AS r
        WHERE b.queue = $1 AND b.key = c.key
      ),
      emptied AS (
        DELETE FROM \(schema).key_buckets WHERE queue = $1 AND key IN (
          SELECT key FROM \(schema).key_buckets
          WHERE queue = $1 AND due IS NULL AND tat <= \(now) - 86400000000
            AND current_setting('\(keyRated)', true) = 'on'
          LIMIT 16)
      )
      SELECT count(*) FROM unparked
      """
  }

  /// The time of a statement in microseconds since 1970, for a rate's bucket: parameter `n` (the
  /// caller's clock to the microsecond) plus the time ``limitLock`` waited for the queue's limit
  /// lock (``limitWaited``), so a claim that waited counts its start from when it got the lock;
  /// or the server's clock when the parameter is NULL (read after any wait).
  static func microsUnderLock(_ parameter: Int) -> String {
    """
    coalesce($\(parameter)::int8 + coalesce(nullif(current_setting('\(limitWaited)', true), '')::int8, 0),
      (extract(epoch FROM statement_timestamp()) * 1000000)::int8)
    """
  }

  /// The queue's rate bucket at `now` (microseconds since 1970, an SQL expression), one row when
  /// the queue `$1` has a rate:
  /// `now_us` (microseconds since 1970), `step` (microseconds between starts), `slack` (`burst - 1`
  /// steps), `base` (the stored time, cut back to a full bucket's worth ahead of `now` and no
  /// earlier than `now`), and `starts`, how many starts it holds. The same arithmetic as
  /// `RateLimit.take` (GCRA): a start is due when `base - slack <= now`.
  static func rateBucket(_ schema: String, now: String) -> String {
    """
    SELECT CASE WHEN b.now_us + b.slack < b.base THEN 0 ELSE (b.now_us + b.slack - b.base) / b.step + 1 END AS starts,
      b.base, b.step, b.slack, b.now_us
    FROM (
      SELECT s.now_us, s.step, s.slack,
        greatest(least(coalesce(s.rate_time, s.now_us), s.now_us + s.slack + s.step), s.now_us) AS base
      FROM (
        SELECT q.rate_time, n.now_us, greatest(1, ceil(1000000 / q.rate))::int8 AS step,
          (q.burst - 1)::int8 * greatest(1, ceil(1000000 / q.rate))::int8 AS slack
        FROM \(schema).queues q, (SELECT \(now) AS now_us) AS n
        WHERE q.name = $1 AND q.rate IS NOT NULL
      ) AS s
    ) AS b
    """
  }

  /// Extends current claims' leases. Parameters: ids, tokens, lease (ms), now, queue.
  static func heartbeat(_ schema: String) -> String {
    """
    UPDATE \(schema).jobs j
    SET lease_expires_at = least(\(Self.now(4)) + $3 * interval '1 millisecond', \(Self.latest))
    WHERE j.id = ANY(ARRAY(
      SELECT s.id FROM unnest($1::int8[], $2::int8[]) AS s(id, token) \(Self.currentClaims(schema, queueParameter: 5))))
    RETURNING j.id, j.claim_token
    """
  }

  /// A running job's new payload under its claim (``PostgresJobStore/checkpoint(_:payload:queue:)``).
  /// Parameters: payload, id, token, queue.
  static func checkpoint(_ schema: String) -> String {
    """
    UPDATE \(schema).jobs SET payload = $1
    WHERE id = $2 AND claim_token = $3 AND status || '' = 'running' AND queue || '' = $4
    """
  }

  /// Expired leases become ready again in their old place (a row another transaction holds, as
  /// its worker settles or heartbeats it, is skipped). Parameters: queue, now.
  static func rescue(_ schema: String) -> String {
    """
    UPDATE \(schema).jobs SET status = 'ready', lease_owner = NULL, lease_expires_at = NULL
    WHERE id = ANY(ARRAY(
      SELECT id FROM \(schema).jobs
      WHERE queue = $1 AND status = 'running' AND lease_expires_at <= \(Self.now(2))
      FOR UPDATE SKIP LOCKED))
    """
  }

  // MARK: Inspecting

  /// Counts by status; scheduled jobs already due count as ready. Parameters: queue, now.
  ///
  /// One count per status, each from the index that holds that status (`jobs_ready`,
  /// `jobs_scheduled` by run date, `jobs_status` for running, dead and held), so nothing reads the
  /// table from end to end: one `count(*) FILTER` over the queue's rows needed every row's
  /// status and run date and was planned as a sequential scan. The ready count reads `jobs_ready`
  /// in its order, so the planner walks the narrow index instead of the table even when nearly
  /// every row is ready.
  var counts: String {
    let now = Self.now(2)
    return """
      SELECT
        (SELECT count(*) FROM (
          SELECT FROM \(schema).jobs WHERE queue = $1 AND status = 'ready' ORDER BY priority DESC, \(Self.place), seq, id
        ) AS ready)
          + (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'scheduled' AND run_at <= \(now)),
        (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'scheduled' AND run_at > \(now)),
        (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'running'),
        (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'dead'),
        (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'completed'),
        (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'cancelled'),
        (SELECT count(*) FROM \(schema).jobs WHERE queue = $1 AND status = 'held')
      """
  }

  /// One job by its primary key. Parameters: id.
  var job: String {
    "SELECT \(Self.columns) FROM \(schema).jobs WHERE id = $1"
  }

  /// A page in ID order of some stored statuses (NULL for all). Each status's part of
  /// `jobs_status` is read in ID order, a page at most from each, and the pages are merged: the
  /// rows read are bounded by the page, however many jobs other queues or statuses hold.
  /// Parameters: queue, after, limit, statuses.
  var list: String {
    """
    SELECT \(Self.columns("page")) FROM
      unnest(coalesce($4::text[], ARRAY['ready', 'scheduled', 'held', 'running', 'dead', 'completed', 'cancelled']))
        AS wanted (status)
      CROSS JOIN LATERAL (
        SELECT \(Self.columns) FROM \(schema).jobs
        WHERE queue = $1 AND status = wanted.status AND id > $2
        ORDER BY id LIMIT $3
      ) AS page
    ORDER BY page.id LIMIT $3
    """
  }

  /// A page of a finished status's jobs in the order they finished (`jobs_finished`), after the
  /// finishing time and ID of the job `$2` when it is of the queue and has that status, from the
  /// oldest otherwise. Parameters: queue, after, limit.
  func history(_ status: String) -> String {
    """
    SELECT \(Self.columns) FROM \(schema).jobs
    WHERE queue = $1 AND status = '\(status)' AND (finished_at, id) > (
      coalesce(
        (SELECT finished_at FROM \(schema).jobs WHERE id = $2 AND queue = $1 AND status = '\(status)'),
        '-infinity'),
      coalesce((SELECT id FROM \(schema).jobs WHERE id = $2 AND queue = $1 AND status = '\(status)'), 0))
    ORDER BY finished_at, id LIMIT $3
    """
  }

  /// Deletes a batch of a finished status's oldest jobs (`jobs_finished`), finished more than
  /// `$2` ms before now (`$3`), or whenever when `$2` is 0, skipping rows another pruner holds;
  /// returns how many. A pruned dead job leaves its line: the next job of the line is promoted
  /// (``promoteLines(_:after:)``). Parameters: queue, age, now, limit.
  func prune(_ status: String) -> String {
    """
    WITH gone AS (
      DELETE FROM \(schema).jobs WHERE id = ANY(ARRAY(
        SELECT id FROM \(schema).jobs WHERE queue = $1 AND status = '\(status)'
          AND ($2::int8 = 0 OR finished_at < \(Self.now(3)) - $2::int8 * interval '1 millisecond')
        ORDER BY finished_at LIMIT $4 FOR UPDATE SKIP LOCKED))
      RETURNING queue AS q, CASE WHEN status = 'dead' THEN ordering_key END AS line
    ),
    \(Self.promoteLines(schema, after: "gone"))
    SELECT count(*) FROM gone UNION ALL SELECT NULL FROM lines WHERE promoted < 0
    """
  }

  /// The server's time, the next ready job's run date (in claim order, so from `jobs_ready`), the
  /// earliest scheduled run date, the earliest lease expiry, the pause flag, the earliest due
  /// schedule, and the rate's next start while its bucket is empty with the time it was read at
  /// (microseconds since 1970). Parameters: queue, now, now in microseconds (NULL: the server's).
  static func nextWake(_ schema: String) -> String {
    """
    SELECT \(Self.now(2)),
      (SELECT run_at FROM \(schema).jobs WHERE queue = $1 AND status = 'ready' AND NOT lim.at_limit
        ORDER BY priority DESC, \(Self.place), seq, id LIMIT 1),
      (SELECT min(run_at) FROM \(schema).jobs WHERE queue = $1 AND status = 'scheduled' AND NOT lim.at_limit),
      (SELECT min(lease_expires_at) FROM \(schema).jobs WHERE queue = $1 AND status = 'running'),
      coalesce((SELECT paused FROM \(schema).queues WHERE name = $1), false),
      (SELECT min(next_due) FROM \(schema).schedules WHERE queue = $1 AND active AND NOT paused),
      b.base - b.slack, b.now_us,
      CASE WHEN NOT lim.at_limit THEN least(
        (SELECT min(due) FROM \(schema).key_buckets WHERE queue = $1 AND due IS NOT NULL),
        (SELECT \(Self.microsUnderLock(3)) WHERE EXISTS (
          SELECT 1 FROM \(schema).key_buckets
          WHERE queue = $1 AND due IS NOT NULL AND due_set > \(Self.microsUnderLock(3))))) END,
      \(Self.microsUnderLock(3))
    FROM (SELECT coalesce((
      SELECT q.concurrency <= \(runningUpToLimit(schema))
      FROM \(schema).queues q WHERE q.name = $1 AND q.concurrency IS NOT NULL), false) AS at_limit) AS lim
    LEFT JOIN (\(rateBucket(schema, now: Self.microsUnderLock(3)))) AS b ON b.base - b.slack > b.now_us
    """
  }

  /// The queues that hold jobs, found in the jobs themselves (one probe of `jobs_status` per
  /// queue: a loose index scan, walking from each queue name to the next), and those with a
  /// pause flag or a limit stored.
  /// Read from the jobs, not from the queues table, so a queue is listed however its jobs came
  /// (the store's adds do not register queues; see ``version3``) and whatever happened to its
  /// row there.
  var queueNames: String {
    """
    WITH RECURSIVE present(name) AS (
      (SELECT queue FROM \(schema).jobs ORDER BY queue LIMIT 1)
      UNION ALL
      SELECT (SELECT j.queue FROM \(schema).jobs j WHERE j.queue > p.name ORDER BY j.queue LIMIT 1)
      FROM present p WHERE p.name IS NOT NULL
    )
    SELECT name FROM (
      SELECT name FROM present WHERE name IS NOT NULL
      UNION
      SELECT name FROM \(schema).queues WHERE paused OR concurrency IS NOT NULL OR rate IS NOT NULL
        OR key_concurrency IS NOT NULL OR key_rate IS NOT NULL
      UNION
      SELECT queue FROM \(schema).key_limits
      UNION
      SELECT queue FROM \(schema).key_rates
    ) AS listed
    ORDER BY name COLLATE "C"
    """
  }

  // MARK: Changing

  /// Deletes jobs of queue `$1` among the IDs `$2`: those not held when `$3` is false, the held
  /// ones alone when it is true (see ``cancel``); returns each one's status and ordering key.
  var remove: String {
    """
    DELETE FROM \(schema).jobs WHERE queue = $1 AND id = ANY($2::int8[]) AND (status = 'held') = $3::bool
    RETURNING status, ordering_key
    """
  }
  /// The held jobs among the IDs `$1` (of queue `$2`, or any when NULL): ID, queue, ordering key.
  var heldAmong: String {
    """
    SELECT id, queue, ordering_key FROM \(schema).jobs
    WHERE id = ANY($1::int8[]) AND ($2::text IS NULL OR queue = $2::text) AND status = 'held'
    """
  }
  /// The jobs among the IDs `$1` of queue `$2` that are not held.
  var presentNotHeld: String {
    "SELECT id FROM \(schema).jobs WHERE id = ANY($1::int8[]) AND queue = $2 AND status <> 'held'"
  }
  /// The ordering keys of the queue's held jobs with IDs up to `$2`.
  var heldLines: String {
    "SELECT DISTINCT ordering_key FROM \(schema).jobs WHERE queue = $1 AND status = 'held' AND id <= $2"
  }
  /// Deletes the queue's held jobs with IDs up to `$2` whose lines `$3` the caller locked; one row
  /// per job.
  var clearHeld: String {
    """
    DELETE FROM \(schema).jobs WHERE queue = $1 AND status = 'held' AND id <= $2 AND ordering_key = ANY($3::text[])
    RETURNING 1
    """
  }
  /// Locks lines. Parameters: queues, keys (pairwise).
  var lockLines: String { "SELECT \(schema).lock_lines($1::text[], $2::text[])" }
  /// Promotes the next job of each line (locking the lines first). Parameters: queues, keys
  /// (pairwise).
  var promoteLinesNow: String { "SELECT \(schema).promote_lines($1::text[], $2::text[])" }
  /// Cancels the unfinished jobs among the IDs `$1` (of queue `$2`, or any when NULL) at `$3`;
  /// returns each found job's ID and status as they were, and (columns 4 and 5) its queue and
  /// ordering key. It cancels the jobs that are not held when `$4` is false (held ones are not
  /// even locked), the held ones alone when it is true: a cancel changes the other jobs first,
  /// then takes the locks of the lines, then cancels the held jobs (see ``version9``'s lock
  /// order). A job of a queue named with a control
  /// character before names were checked (``version4``'s `NOT VALID` check refuses any change of
  /// such a row) is deleted instead, as every cancel did before the history was kept.
  ///
  /// The same statement announces the running jobs it cancelled on ``cancelChannel``, one
  /// notification per queue (see ``CancelPayload``): `NOTIFY` delivers it when the transaction
  /// commits, never for one rolled back. A payload must stay under 8,000 bytes: one too long to
  /// name its jobs says "* queue" (check every claim of the queue), and one whose queue name alone
  /// is too long says "*" (every queue).
  var cancel: String {
    """
    WITH target AS (
      SELECT id, status, queue, ordering_key, queue ~ '[\\x01-\\x1f\\x7f]' AS unprintable FROM \(schema).jobs
      WHERE id = ANY($1::int8[]) AND ($2::text IS NULL OR queue = $2::text) AND (status = 'held') = $4::bool
      FOR UPDATE
    ), gone AS (
      UPDATE \(schema).jobs j SET status = 'cancelled', finished_at = \(Self.now(3)), lease_owner = NULL,
        lease_expires_at = NULL
      FROM target t WHERE j.id = t.id AND t.status IN ('ready', 'scheduled', 'held', 'running') AND NOT t.unprintable
      RETURNING j.id, j.queue, t.status
    ), legacy AS (
      DELETE FROM \(schema).jobs j USING target t
      WHERE j.id = t.id AND t.status IN ('ready', 'scheduled', 'held', 'running') AND t.unprintable
      RETURNING j.id, j.queue, t.status
    ), told AS (
      SELECT pg_notify('\(cancelChannel)', CASE
          WHEN octet_length(named) < \(CancelPayload.limit) THEN named
          WHEN octet_length(queue) < \(CancelPayload.limit - 2) THEN '* ' || queue
          ELSE '*' END)
      FROM (
        SELECT queue, string_agg(id::text, ',' ORDER BY id) || ' ' || queue AS named
        FROM (SELECT * FROM gone UNION ALL SELECT * FROM legacy) AS stopped
        WHERE status = 'running' GROUP BY queue
      ) running
    )
    SELECT t.id, t.status, (SELECT count(*) FROM gone) + (SELECT count(*) FROM legacy), (SELECT count(*) FROM told),
      t.queue, t.ordering_key
    FROM target t
    """
  }
  /// The running jobs of queue `$2` among the IDs `$1`, with their claim tokens.
  var runningClaims: String {
    "SELECT id, claim_token FROM \(schema).jobs WHERE id = ANY($1::int8[]) AND queue = $2 AND status = 'running'"
  }

  /// The count and highest ID of some statuses' jobs (`jobs_status`). Parameters: queue, statuses.
  var tally: String {
    "SELECT count(*), max(id) FROM \(schema).jobs WHERE queue = $1 AND status = ANY($2::text[])"
  }
  /// Deletes some statuses' jobs (never held ones: ``clearHeld``) with IDs up to a bound; each
  /// deleted job's status and ordering key. Parameters: queue, statuses, the bound.
  var clearThrough: String {
    """
    DELETE FROM \(schema).jobs WHERE queue = $1 AND status = ANY($2::text[]) AND id <= $3
    RETURNING status, ordering_key
    """
  }

  static func isPaused(_ schema: String) -> String {
    "SELECT coalesce((SELECT paused FROM \(schema).queues WHERE name = $1), false)"
  }
  /// The stored limits: concurrency, rate, burst. Parameter: queue.
  var limits: String {
    """
    SELECT concurrency::int8, rate, burst::int8, key_concurrency::int8, key_rate, key_burst::int8
    FROM \(schema).queues WHERE name = $1
    """
  }
  /// The queue's limit keys with running or held jobs (`jobs_key_running`, `jobs_parked`): key,
  /// running, held; most held first, then most running, then by bytes. Parameters: queue, the most
  /// keys.
  var limitKeyUsage: String {
    """
    SELECT limit_key, sum(running)::int8, sum(held)::int8 FROM (
      SELECT limit_key, 1 AS running, 0 AS held FROM \(schema).jobs
      WHERE queue = $1 AND status = 'running' AND limit_key IS NOT NULL
      UNION ALL
      SELECT limit_key, 0, 1 FROM \(schema).jobs WHERE queue = $1 AND status = 'held' AND parked) AS u
    GROUP BY limit_key ORDER BY 3 DESC, 2 DESC, limit_key COLLATE "C" LIMIT $2
    """
  }
  /// The queue's overrides of its limit per key. Parameter: queue.
  var keyOverrides: String {
    "SELECT key, concurrency::int8 FROM \(schema).key_limits WHERE queue = $1 ORDER BY key COLLATE \"C\""
  }
  /// Removes the queue's overrides. Parameter: queue.
  var deleteKeyOverrides: String { "DELETE FROM \(schema).key_limits WHERE queue = $1" }
  /// The queue's rates of single keys. Parameter: queue.
  var keyRateOverrides: String {
    "SELECT key, rate, burst::int8 FROM \(schema).key_rates WHERE queue = $1 ORDER BY key COLLATE \"C\""
  }
  /// Removes the queue's rates of single keys. Parameter: queue.
  var deleteKeyRateOverrides: String { "DELETE FROM \(schema).key_rates WHERE queue = $1" }
  /// Stores rates of single keys. Parameters: queue, keys, rates, bursts.
  var insertKeyRateOverrides: String {
    """
    INSERT INTO \(schema).key_rates (queue, key, rate, burst)
    SELECT $1, o.key, o.rate, o.burst FROM unnest($2::text[], $3::float8[], $4::int8[]) AS o(key, rate, burst)
    """
  }
  /// Forgets the queue's key buckets (it has no rate per key). Parameter: queue.
  var deleteKeyBuckets: String { "DELETE FROM \(schema).key_buckets WHERE queue = $1" }
  /// Stores overrides. Parameters: queue, keys, limits (pairwise).
  var insertKeyOverrides: String {
    """
    INSERT INTO \(schema).key_limits (queue, key, concurrency)
    SELECT $1, o.key, o.concurrency FROM unnest($2::text[], $3::int8[]) AS o(key, concurrency)
    """
  }
  /// Takes the queue's limit lock (``limitLock``'s) for the rest of the transaction, waiting for a
  /// claim that holds it. Parameter: queue.
  var takeLimitLock: String { "SELECT pg_advisory_xact_lock(\(Self.limitLockKey(schema, queue: "$1")))" }
  /// Every job of the queue held for its key's limit is ready again (the limits changed).
  /// Parameter: queue.
  var unparkAll: String {
    "UPDATE \(schema).jobs SET status = 'ready', parked = NULL WHERE queue = $1 AND status = 'held' AND parked"
  }
  /// Stores the limits (NULL: none). Parameters: queue, concurrency, rate, burst, limit per key. The rate's
  /// stored time is kept while a rate is set, so changing the rate does not refill the bucket.
  var setLimits: String {
    """
    INSERT INTO \(schema).queues (name, concurrency, rate, burst, key_concurrency, key_rate, key_burst)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate,
      burst = excluded.burst, key_concurrency = excluded.key_concurrency, key_rate = excluded.key_rate,
      key_burst = excluded.key_burst,
      rate_time = CASE WHEN excluded.rate IS NULL THEN NULL ELSE queues.rate_time END
    """
  }
  var setPaused: String {
    """
    INSERT INTO \(schema).queues (name, paused) VALUES ($1, $2)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused
    """
  }
  /// Wakes listening workers (pause, resume, re-queue, a retry or release, a rescue). Parameter:
  /// queue.
  static func notify(_ channel: String) -> String { "SELECT pg_notify('\(channel)', $1)" }

  /// What re-queueing sets: ready, or held when an earlier job of its line is still there (a
  /// dead job is normally its line's first).
  private func requeued(_ nowParameter: Int) -> String {
    """
    UPDATE \(schema).jobs j SET status = CASE WHEN j.ordering_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM \(schema).jobs l WHERE l.queue = j.queue AND l.ordering_key = j.ordering_key
          AND l.status IN (\(Self.lineStatuses)) AND l.id < j.id) THEN 'held' ELSE 'ready' END,
      run_at = \(Self.now(nowParameter)), seq = 0, attempts = 0,
      lease_owner = NULL, lease_expires_at = NULL, finished_at = NULL
    """
  }
  /// The queue's dead jobs among the IDs `$2` (all when NULL), oldest first, with their keys and
  /// whether each has a fairness key.
  var deadJobs: String {
    """
    SELECT id, dedup_key, ordering_key, fairness_key IS NOT NULL FROM \(schema).jobs
    WHERE queue = $1 AND status = 'dead' AND ($2::int8[] IS NULL OR id = ANY($2::int8[])) ORDER BY id
    """
  }
  /// Dead jobs without a deduplication key, by ID (their locks are held: see ``deadJobs``); a row
  /// another transaction holds (a prune or removal under way) is skipped. Parameters: queue, now,
  /// IDs.
  var requeueWithoutKey: String {
    """
    \(requeued(2)) WHERE j.id = ANY(ARRAY(
      SELECT id FROM \(schema).jobs WHERE queue = $1 AND status = 'dead' AND id = ANY($3::int8[])
        AND dedup_key IS NULL FOR UPDATE SKIP LOCKED))
    """
  }
  /// One dead job, unless a waiting job holds its key; skipped when another transaction holds it.
  /// Parameters: queue, now, id.
  var requeueOne: String {
    """
    \(requeued(2)) WHERE j.id = ANY(ARRAY(
      SELECT id FROM \(schema).jobs WHERE queue = $1 AND status = 'dead' AND id = $3 FOR UPDATE SKIP LOCKED))
    AND (j.dedup_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM \(schema).jobs live WHERE live.queue = j.queue AND live.dedup_key = j.dedup_key
      AND live.status IN ('ready', 'scheduled', 'held')))
    """
  }
}
