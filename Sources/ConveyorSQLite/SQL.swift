import CSQLite
import Conveyor

/// The store's schema and statements.
///
/// Statuses are written as literals, not parameters, so SQLite can use the partial indexes.
///
/// A waiting job is stored `ready` once its run date has come and `scheduled` before that; a
/// claim first promotes the scheduled jobs that fell due (a range of `jobs_scheduled`), so the
/// ready index is ordered by priority and run date alone and a claim reads its first entries,
/// however many priority levels or not-yet-due jobs there are.
///
/// Which index each statement uses:
/// - `jobs_ready (queue, priority DESC, run_at, seq, id) WHERE status = 'ready'`: claims
///   (``selectReady``), "is anything ready" (``anyReady``), and a retry's place (``retry``).
/// - `jobs_scheduled (queue, run_at) WHERE status = 'scheduled'`: promotion (``promote``), the
///   next run date (``nextScheduled``), and the ready/scheduled split of ``countScheduled``.
/// - `jobs_running (queue, id) WHERE status = 'running'`: listings and counts of running jobs,
///   rescues and the next lease expiry (the few jobs under a lease).
/// - `jobs_dead (queue, id) WHERE status = 'dead'`: listings and counts of dead jobs, re-queueing.
/// - No index covers every status: each claim and enqueue would pay for it, and they are the hot
///   path (a full `(queue, status, id)` index made claims 2.3 times as expensive at 1M jobs).
/// - Listings of waiting jobs (and of all jobs) read a window of the table in ID order from
///   `after`, then the queue's own partial indexes (`SQLiteJobStore+Listing.swift`), never the
///   whole table.
/// - `jobs_dedup (queue, dedup_key) WHERE … waiting`: the duplicate check of an enqueue.
/// - The primary key: every settlement, heartbeat and claim update by `id`, and ``job``.
enum SQL {
  /// The jobs table of versions 2 and 3 (claim tokens, ready and scheduled states), which
  /// ``migrate1to2`` builds; version 4 adds ``seqColumn``.
  static let tablesVersion2 = """
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      queue TEXT NOT NULL,
      payload BLOB NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('ready', 'scheduled', 'running', 'dead')),
      priority INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      run_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL,
      last_error TEXT,
      dedup_key TEXT,
      lease_owner TEXT,
      lease_expires_at INTEGER,
      claim_token INTEGER NOT NULL DEFAULT 0
    );
    """
  /// Version 4: a job's place among ready jobs of the same priority and run date. 0 for a job
  /// added, scheduled, or re-queued; a job retried straight into the ready state takes the next
  /// number of its queue's counter (``nextRetryPlace``), so it goes behind every job ready when
  /// it was retried, and jobs retried one after another keep that order. A release or rescue
  /// keeps it (the job keeps its place).
  static let seqColumn = "seq INTEGER NOT NULL DEFAULT 0"
  /// The claim order's index (version 4: with ``seqColumn``).
  static let readyIndex = """
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, seq, id) WHERE status = 'ready';
    """
  /// Version 5: a job's own time limit in milliseconds (`NewJob.timeLimit`); NULL: the queue's.
  static let timeLimitColumn = "time_limit_ms INTEGER"
  /// The jobs table of versions 6 to 8: the finished states `completed` and `cancelled`, and each job's
  /// history: when it finished, its attempts' errors (a JSON array of strings, the latest
  /// ``JobHistory/maximumErrors``), how long its last attempt ran, its output.
  static let tablesVersion6 = """
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      queue TEXT NOT NULL,
      payload BLOB NOT NULL,
      status TEXT NOT NULL
        CHECK (status IN ('ready', 'scheduled', 'running', 'dead', 'completed', 'cancelled')),
      priority INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      run_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL,
      last_error TEXT,
      dedup_key TEXT,
      lease_owner TEXT,
      lease_expires_at INTEGER,
      claim_token INTEGER NOT NULL DEFAULT 0,
      \(seqColumn),
      \(timeLimitColumn),
      finished_at INTEGER,
      errors TEXT,
      run_ms INTEGER,
      output BLOB
    );
    """
  /// The jobs table of version 9: the `held` state, each job's ordering key, and `line`: 1 while
  /// the job is in its key's line (see ``orderedIndex``), NULL otherwise. A held job waits behind
  /// an earlier job of its key; it is in no claim index, so a claim never reads it.
  static let tables = """
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      queue TEXT NOT NULL,
      payload BLOB NOT NULL,
      status TEXT NOT NULL
        CHECK (status IN ('ready', 'scheduled', 'held', 'running', 'dead', 'completed', 'cancelled')),
      priority INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      run_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL,
      last_error TEXT,
      dedup_key TEXT,
      lease_owner TEXT,
      lease_expires_at INTEGER,
      claim_token INTEGER NOT NULL DEFAULT 0,
      \(seqColumn),
      \(timeLimitColumn),
      finished_at INTEGER,
      errors TEXT,
      run_ms INTEGER,
      output BLOB,
      ordering_key TEXT,
      line INTEGER
    );
    """
  /// The indexes of versions 2 and 3.
  static let indexesVersion2 = """
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE status = 'ready';
    \(otherIndexes)
    """
  /// The indexes of version 4 and 5.
  static let indexesVersion4 = """
    \(readyIndex)
    \(otherIndexes)
    """
  /// Version 6: each finished status's jobs by queue and finishing time, for pruning (oldest
  /// first), counts and history pages. One index per status: SQLite uses a partial index only
  /// when a query's terms imply its `WHERE`, and `status = 'completed'` does not imply
  /// `status IN ('completed', …)`. Waiting and running jobs are in none, so claims and adds never
  /// touch them; a completion adds one entry at the end of `jobs_completed`.
  static let finishedIndex = """
    CREATE INDEX jobs_completed ON jobs (queue, finished_at) WHERE status = 'completed';
    CREATE INDEX jobs_cancelled ON jobs (queue, finished_at) WHERE status = 'cancelled';
    CREATE INDEX jobs_dead_finished ON jobs (queue, finished_at) WHERE status = 'dead';
    """
  /// The indexes of version 6.
  static let indexesVersion6 = """
    \(indexesVersion4)
    \(finishedIndex)
    """
  /// Version 7: the running and completed jobs that have a deduplication key, by key, for the
  /// wider deduplication scopes (`DeduplicationScope.waitingOrRunning`, `.completedWithin`).
  /// Jobs without a key are in none of it, so their claims and completions never touch it.
  static let keyedIndex = """
    CREATE INDEX jobs_keyed ON jobs (queue, dedup_key, status, finished_at)
      WHERE dedup_key IS NOT NULL AND status IN ('running', 'completed');
    """
  /// The indexes of versions 7 and 8.
  static let indexesVersion7 = """
    \(indexesVersion6)
    \(keyedIndex)
    """
  /// Version 9: each ordering key's line, the jobs of the key that wait (held or not), run or
  /// are dead, in ID order: its first entry is the one job of the key that may be other than
  /// held. Jobs without a key are in none of it. Membership is the `line` flag, not the status, so
  /// a keyed job's claim, retry or death leaves the index as it is (an index whose `WHERE` names
  /// the status is rewritten at every change of status: a drain of keyed jobs ran at a quarter
  /// of the speed of unkeyed ones with it); only joining and leaving the line touch it.
  static let orderedIndex = """
    CREATE INDEX jobs_line ON jobs (queue, ordering_key, id) WHERE line = 1;
    CREATE INDEX jobs_held ON jobs (queue, id) WHERE status = 'held';
    """
  /// The waiting jobs by key (version 9: held ones too), for the duplicate check of an enqueue.
  static let dedupIndex = """
    CREATE INDEX jobs_dedup ON jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('ready', 'scheduled', 'held');
    """
  /// The indexes of version 9.
  static let indexes = """
    \(readyIndex)
    CREATE INDEX jobs_scheduled ON jobs (queue, run_at) WHERE status = 'scheduled';
    \(dedupIndex)
    CREATE INDEX jobs_running ON jobs (queue, id) WHERE status = 'running';
    CREATE INDEX jobs_dead ON jobs (queue, id) WHERE status = 'dead';
    \(finishedIndex)
    \(keyedIndex)
    \(orderedIndex)
    """
  /// The indexes every version since 2 has.
  static let otherIndexes = """
    CREATE INDEX jobs_scheduled ON jobs (queue, run_at) WHERE status = 'scheduled';
    CREATE INDEX jobs_dedup ON jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('ready', 'scheduled');
    CREATE INDEX jobs_running ON jobs (queue, id) WHERE status = 'running';
    CREATE INDEX jobs_dead ON jobs (queue, id) WHERE status = 'dead';
    """
  /// The queues table of versions 2 and 3.
  static let queuesTableVersion2 = """
    CREATE TABLE queues (name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
    """
  /// Version 4: a queue's counter of places given to jobs retried straight into the ready state.
  static let retrySeqColumn = "retry_seq INTEGER NOT NULL DEFAULT 0"
  /// The queues table of versions 4 to 9.
  static let queuesTableVersion4 = """
    CREATE TABLE queues (name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0, \(retrySeqColumn)) WITHOUT ROWID;
    """
  /// Version 10: the queue's stored `QueueLimits.concurrency` (NULL: none).
  static let concurrencyColumn = "concurrency INTEGER"
  /// Version 11: the queue's stored `QueueLimits.rate` (starts a second and burst; NULL: none),
  /// and the rate's stored time (GCRA's theoretical arrival time, microseconds since 1970; NULL:
  /// no start taken yet).
  /// The checks keep out what no `RateLimit` can be (the library checks the exact bounds).
  static let rateColumns = [
    "rate REAL CHECK (rate > 0.00001 AND rate <= 1000000)",
    "burst INTEGER CHECK (burst BETWEEN 1 AND 1000000)",
    "rate_time INTEGER",
  ]
  /// The queues table of version 11.
  static let queuesTable = """
    CREATE TABLE queues (
      name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 0, \(retrySeqColumn), \(concurrencyColumn),
      \(rateColumns.joined(separator: ", "))
    ) WITHOUT ROWID;
    """
  /// Raises the queue's counter of retry places (``retry`` reads it); the row is made if missing.
  static let nextRetryPlace = """
    INSERT INTO queues (name, retry_seq) VALUES (?, 1)
    ON CONFLICT (name) DO UPDATE SET retry_seq = retry_seq + 1
    """
  /// Version 3: workers' per-minute counts (``SQLiteJobStore/recordActivity(_:)``), keyed by
  /// queue and minute (milliseconds since 1970), so a chart reads one range of the key.
  /// Version 6 adds ``stuckColumn``.
  static let activityTableVersion3 = """
    CREATE TABLE activity (
      queue TEXT NOT NULL,
      minute INTEGER NOT NULL,
      succeeded INTEGER NOT NULL DEFAULT 0,
      retried INTEGER NOT NULL DEFAULT 0,
      died INTEGER NOT NULL DEFAULT 0,
      started INTEGER NOT NULL DEFAULT 0,
      wait_total_ms INTEGER NOT NULL DEFAULT 0,
      wait_max_ms INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (queue, minute)
    ) WITHOUT ROWID;
    CREATE INDEX activity_minute ON activity (minute);
    """
  /// Version 6: handlers reported stuck per minute.
  static let stuckColumn = "stuck INTEGER NOT NULL DEFAULT 0"
  /// The activity table of version 6.
  static let activityTable = activityTableVersion3.replacingOccurrences(
    of: "wait_max_ms INTEGER NOT NULL DEFAULT 0,",
    with: "wait_max_ms INTEGER NOT NULL DEFAULT 0,\n  \(stuckColumn),")
  /// Version 8: stored schedules, one row each, keyed by queue and name (see
  /// `SQLiteJobStore+Schedules`): the definition, with the deduplication of its jobs in the last
  /// three columns, and where it stands; `created_at`, `last_slot` and `next_due` are
  /// milliseconds since 1970.
  static let schedulesTable = """
    CREATE TABLE schedules (
      queue TEXT NOT NULL,
      name TEXT NOT NULL,
      spacing TEXT NOT NULL,
      time_zone TEXT NOT NULL,
      catch_up TEXT NOT NULL,
      jitter_ms INTEGER NOT NULL,
      payload BLOB NOT NULL,
      priority INTEGER NOT NULL,
      time_limit_ms INTEGER,
      origin TEXT NOT NULL,
      active INTEGER NOT NULL,
      paused INTEGER NOT NULL,
      created_at INTEGER NOT NULL,
      last_slot INTEGER,
      next_due INTEGER,
      dedup_key TEXT,
      dedup_scope TEXT NOT NULL,
      on_conflict TEXT NOT NULL,
      PRIMARY KEY (queue, name)
    ) WITHOUT ROWID;
    CREATE INDEX schedules_due ON schedules (queue, next_due) WHERE active = 1 AND paused = 0;
    """
  static let schema = """
    \(tables)
    \(indexes)
    \(queuesTable)
    \(activityTable)
    \(schedulesTable)
    \(version12)
    \(version13)
    \(version14)
    PRAGMA application_id = \(SQLiteJobStore.applicationID);
    PRAGMA user_version = \(SQLiteJobStore.schemaVersion);
    """

  /// Version 1 to 2, in one transaction: the table is rebuilt (SQLite cannot change a `CHECK`
  /// constraint in place). Waiting jobs become `scheduled` and the first claim promotes those
  /// that are due; running jobs keep their leases (claim token 0) and run again once the lease
  /// passes. Stop workers of the previous release before opening the file with this one: they
  /// cannot claim from the new states.
  /// The caller carries the `AUTOINCREMENT` counter over, so IDs are never reused.
  static let migrate1to2 = """
    ALTER TABLE jobs RENAME TO jobs_v1;
    DROP INDEX IF EXISTS jobs_ready;
    DROP INDEX IF EXISTS jobs_dedup;
    DROP INDEX IF EXISTS jobs_lease;
    DROP INDEX IF EXISTS jobs_dead;
    \(tablesVersion2)
    INSERT INTO jobs (id, queue, payload, status, priority, attempts, run_at, created_at, last_error,
      dedup_key, lease_owner, lease_expires_at, claim_token)
    SELECT id, queue, payload, CASE status WHEN 'pending' THEN 'scheduled' ELSE status END, priority,
      attempts, run_at, created_at, last_error, dedup_key, lease_owner, lease_expires_at, 0
    FROM jobs_v1;
    DROP TABLE jobs_v1;
    \(indexesVersion2)
    ALTER TABLE queues RENAME TO queues_v1;
    \(queuesTableVersion2)
    INSERT INTO queues (name, paused) SELECT name, paused FROM queues_v1;
    INSERT OR IGNORE INTO queues (name) SELECT DISTINCT queue FROM jobs;
    DROP TABLE queues_v1;
    PRAGMA user_version = 2;
    """
  /// Version 2 to 3: adds the activity table; every job stays as it is.
  static let migrate2to3 = """
    \(activityTableVersion3)
    PRAGMA user_version = 3;
    """
  /// Version 3 to 4: every job keeps its place (``seqColumn`` 0), the claim's index gains the
  /// column, and each queue its counter of places given to retried jobs.
  static let migrate3to4 = """
    ALTER TABLE jobs ADD COLUMN \(seqColumn);
    ALTER TABLE queues ADD COLUMN \(retrySeqColumn);
    DROP INDEX jobs_ready;
    \(readyIndex)
    PRAGMA user_version = 4;
    """
  /// Version 4 to 5: every job keeps the queue's time limit (``timeLimitColumn`` NULL). Adding a
  /// nullable column rewrites no row.
  static let migrate4to5 = """
    ALTER TABLE jobs ADD COLUMN \(timeLimitColumn);
    PRAGMA user_version = 5;
    """
  /// Version 5 to 6, in one transaction: the table is rebuilt (SQLite cannot change a `CHECK`
  /// constraint in place) with every job. A dead job counts as finished when it is migrated (so
  /// no dead job is pruned at the first start), and a job's last error starts its list of
  /// errors. The caller carries the `AUTOINCREMENT` counter over.
  static func migrate5to6(now: Int64) -> String {
    """
    ALTER TABLE jobs RENAME TO jobs_v5;
    DROP INDEX jobs_ready;
    DROP INDEX jobs_scheduled;
    DROP INDEX jobs_dedup;
    DROP INDEX jobs_running;
    DROP INDEX jobs_dead;
    \(tablesVersion6)
    INSERT INTO jobs (id, queue, payload, status, priority, attempts, run_at, created_at, last_error,
      dedup_key, lease_owner, lease_expires_at, claim_token, seq, time_limit_ms, finished_at, errors)
    SELECT id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key,
      lease_owner, lease_expires_at, claim_token, seq, time_limit_ms,
      CASE status WHEN 'dead' THEN \(now) END,
      CASE WHEN last_error IS NOT NULL THEN json_array(last_error) END
    FROM jobs_v5;
    DROP TABLE jobs_v5;
    \(indexesVersion6)
    ALTER TABLE activity ADD COLUMN \(stuckColumn);
    PRAGMA user_version = 6;
    """
  }
  /// Version 6 to 7: one index more (``keyedIndex``).
  static let migrate6to7 = """
    \(keyedIndex)
    PRAGMA user_version = 7;
    """
  /// Version 7 to 8: the schedules table; every job stays as it is.
  static let migrate7to8 = """
    \(schedulesTable)
    PRAGMA user_version = 8;
    """
  /// Version 8 to 9, in one transaction: the table is rebuilt (SQLite cannot change a `CHECK`
  /// constraint in place) with every job as it was, none of them with an ordering key. The
  /// caller carries the `AUTOINCREMENT` counter over.
  static let migrate8to9 = """
    DROP INDEX jobs_ready;
    DROP INDEX jobs_scheduled;
    DROP INDEX jobs_dedup;
    DROP INDEX jobs_running;
    DROP INDEX jobs_dead;
    DROP INDEX jobs_completed;
    DROP INDEX jobs_cancelled;
    DROP INDEX jobs_dead_finished;
    DROP INDEX jobs_keyed;
    ALTER TABLE jobs RENAME TO jobs_v8;
    \(tables)
    INSERT INTO jobs (id, queue, payload, status, priority, attempts, run_at, created_at, last_error,
      dedup_key, lease_owner, lease_expires_at, claim_token, seq, time_limit_ms, finished_at, errors, run_ms,
      output)
    SELECT id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key,
      lease_owner, lease_expires_at, claim_token, seq, time_limit_ms, finished_at, errors, run_ms, output
    FROM jobs_v8;
    DROP TABLE jobs_v8;
    \(indexes)
    PRAGMA user_version = 9;
    """
  /// Version 9 to 10: queues keep a concurrency limit (none set).
  static let migrate9to10 = """
    ALTER TABLE queues ADD COLUMN \(concurrencyColumn);
    PRAGMA user_version = 10;
    """
  /// Version 10 to 11: queues keep a rate limit (none set).
  static let migrate10to11 =
    rateColumns.map { "ALTER TABLE queues ADD COLUMN \($0);\n" }.joined() + "PRAGMA user_version = 11;"
  /// Version 11 to 12: limits per key (none set, no job with a limit key).
  static let migrate11to12 = "\(version12)\nPRAGMA user_version = 12;"
  /// Version 12 to 13: rates per key (none set).
  static let migrate12to13 = "\(version13)\nPRAGMA user_version = 13;"
  /// Version 13 to 14: fair shares (no job with a fairness key; the claim order's indexes rebuilt).
  static let migrate13to14 = "\(version14)\nPRAGMA user_version = 14;"

  /// What version 14 adds to version 13: fair shares (`FairTurns` states the rule).
  /// - `jobs.fairness_key`: the job's `NewJob.fairnessKey`.
  /// - `jobs.turn`: a ready job's turn among its priority's ready jobs (milliseconds, as run
  ///   dates), taken by ``takeTurn`` when a job with a fairness key becomes ready; NULL for jobs
  ///   without one, and for scheduled jobs (a retry, a re-queue and a replacement clear it).
  /// - `fair_keys`: each key's latest turn at each priority; `fair_keys_latest`: the latest turn of
  ///   any key at a priority, for a job that finds no job of its priority waiting in its place.
  /// - `jobs_ready` and `jobs_parked` order by *place*, `coalesce(turn, run_at)`: a job without a
  ///   fairness key keeps its run date as its place. The limit-key triggers that make a held job
  ///   ready again are recreated in that order. `jobs_parked_place`: the jobs held by their limit
  ///   key by priority and place, for the head of a priority (``takeTurn``).
  /// - Two triggers give a job its turn as it becomes ready, whatever the path: inserted ready,
  ///   promoted, retried, re-queued, made ready by an operator, replaced. A job that keeps its
  ///   turn (released, rescued, held by a limit and made ready again) keeps its `turn`, and the
  ///   triggers leave it alone.
  static let version14 = """
    ALTER TABLE jobs ADD COLUMN fairness_key TEXT;
    ALTER TABLE jobs ADD COLUMN turn INTEGER;
    CREATE TABLE fair_keys (
      queue TEXT NOT NULL,
      priority INTEGER NOT NULL,
      key TEXT NOT NULL,
      turn INTEGER NOT NULL,
      PRIMARY KEY (queue, priority, key)
    ) WITHOUT ROWID;
    CREATE INDEX fair_keys_latest ON fair_keys (queue, priority, turn);
    DROP INDEX jobs_ready;
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, coalesce(turn, run_at), seq, id) WHERE status = 'ready';
    DROP INDEX jobs_parked;
    CREATE INDEX jobs_parked ON jobs (queue, limit_key, priority DESC, coalesce(turn, run_at), seq, id)
      WHERE status = 'held' AND parked = 1;
    CREATE INDEX jobs_parked_place ON jobs (queue, priority, coalesce(turn, run_at)) WHERE status = 'held' AND parked = 1;
    DROP TRIGGER jobs_key_stopped;
    CREATE TRIGGER jobs_key_stopped AFTER UPDATE OF status ON jobs
    WHEN OLD.limit_key IS NOT NULL AND (
      (OLD.status = 'running' AND NEW.status <> 'running')
      OR (OLD.status = 'ready' AND NEW.status NOT IN ('running', 'held')))
    BEGIN
      \(unparkFirst)
    END;
    DROP TRIGGER jobs_key_deleted;
    CREATE TRIGGER jobs_key_deleted AFTER DELETE ON jobs
    WHEN OLD.status IN ('running', 'ready') AND OLD.limit_key IS NOT NULL
    BEGIN
      \(unparkFirst)
    END;
    CREATE TRIGGER jobs_fair_inserted AFTER INSERT ON jobs
    WHEN NEW.status = 'ready' AND NEW.fairness_key IS NOT NULL AND NEW.turn IS NULL
    BEGIN
      \(takeTurn)
    END;
    CREATE TRIGGER jobs_fair_ready AFTER UPDATE OF status ON jobs
    WHEN NEW.status = 'ready' AND NEW.fairness_key IS NOT NULL AND NEW.turn IS NULL
    BEGIN
      \(takeTurn)
    END;
    """
  /// In a trigger on a job with a fairness key that became ready without a turn (`NEW`): it takes
  /// `max(head, previous + 1)` (`FairTurns`), where `head` is the place of the first other job of
  /// its priority that is ready (`jobs_ready`) or held by its limit key (`jobs_parked_place`),
  /// or with none the later of its run date and the latest
  /// turn any key took at its priority (`fair_keys_latest`), and `previous` its key's latest turn
  /// at its priority; the key's turn is then raised to it.
  private static let takeTurn = """
    UPDATE jobs SET turn = max(
        coalesce(
          (SELECT min(coalesce(r.place, p.place), coalesce(p.place, r.place)) FROM
            (SELECT (SELECT coalesce(h.turn, h.run_at) FROM jobs AS h INDEXED BY jobs_ready
              WHERE h.queue = NEW.queue AND h.status = 'ready' AND h.priority = NEW.priority AND h.id <> NEW.id
              ORDER BY coalesce(h.turn, h.run_at), h.seq, h.id LIMIT 1) AS place) AS r,
            (SELECT (SELECT coalesce(h.turn, h.run_at) FROM jobs AS h INDEXED BY jobs_parked_place
              WHERE h.queue = NEW.queue AND h.status = 'held' AND h.parked = 1 AND h.priority = NEW.priority
                AND h.id <> NEW.id
              ORDER BY coalesce(h.turn, h.run_at) LIMIT 1) AS place) AS p),
          max(NEW.run_at, coalesce(
            (SELECT max(f.turn) FROM fair_keys AS f WHERE f.queue = NEW.queue AND f.priority = NEW.priority),
            NEW.run_at))),
        coalesce(
          (SELECT CASE WHEN f.turn < 9223372036854775807 THEN f.turn + 1 ELSE f.turn END FROM fair_keys AS f
            WHERE f.queue = NEW.queue AND f.priority = NEW.priority AND f.key = NEW.fairness_key),
          -9223372036854775808))
      WHERE id = NEW.id;
    INSERT INTO fair_keys (queue, priority, key, turn)
      SELECT NEW.queue, NEW.priority, NEW.fairness_key, turn FROM jobs WHERE id = NEW.id
      ON CONFLICT (queue, priority, key) DO UPDATE SET turn = max(turn, excluded.turn);
    """

  /// What version 13 adds to version 12: rates per limit key.
  /// - `queues.key_rate`, `queues.key_burst`: `QueueLimits.keyRate`; `key_rates`: its overrides.
  /// - `key_buckets`: per limit key with a rate, its bucket's stored time (`tat`, GCRA's,
  ///   microseconds since 1970; no row: a full bucket) and, while the rate holds jobs of the key
  ///   (parked, as for a key's concurrency limit), `due`: when the bucket gives them a start, and
  ///   `due_set`: the claim's time when it noted it. The first claim of the queue from `due`, or
  ///   with its clock before `due_set` (stepped back), makes that many of them ready
  ///   (`key_buckets_due`, `key_buckets_due_set`). Rows of buckets full for a day and holding
  ///   nothing are deleted as claims meet them (`key_buckets_full`).
  static let version13 = """
    ALTER TABLE queues ADD COLUMN key_rate REAL;
    ALTER TABLE queues ADD COLUMN key_burst INTEGER;
    CREATE TABLE key_rates (
      queue TEXT NOT NULL,
      key TEXT NOT NULL,
      rate REAL NOT NULL,
      burst INTEGER NOT NULL,
      PRIMARY KEY (queue, key)
    ) WITHOUT ROWID;
    CREATE TABLE key_buckets (
      queue TEXT NOT NULL,
      key TEXT NOT NULL,
      tat INTEGER NOT NULL,
      due INTEGER,
      due_set INTEGER,
      PRIMARY KEY (queue, key)
    ) WITHOUT ROWID;
    CREATE INDEX key_buckets_due ON key_buckets (queue, due) WHERE due IS NOT NULL;
    CREATE INDEX key_buckets_due_set ON key_buckets (queue, due_set) WHERE due IS NOT NULL;
    CREATE INDEX key_buckets_full ON key_buckets (queue, tat) WHERE due IS NULL;
    """
  /// The rate of key `?2`: its override, else the queue's rate per key (rate, burst; no row or NULLs: none).
  static let keyRate = """
    SELECT coalesce(o.rate, q.key_rate), CASE WHEN o.rate IS NOT NULL THEN o.burst ELSE q.key_burst END
    FROM queues q LEFT JOIN key_rates o ON o.queue = q.name AND o.key = ?2 WHERE q.name = ?1
    """
  /// A key's bucket: its stored time.
  static let keyBucket = "SELECT tat FROM key_buckets WHERE queue = ?1 AND key = ?2"
  /// Stores a key's bucket time (`?3`) after a claim at `?5` took starts, and when the rate held a
  /// job the time `?4` its held jobs are due (the earlier of a stored one and it, with the time it
  /// was noted).
  static let storeKeyBucket = """
    INSERT INTO key_buckets (queue, key, tat, due, due_set) VALUES (?1, ?2, ?3, ?4, CASE WHEN ?4 IS NOT NULL THEN ?5 END)
    ON CONFLICT (queue, key) DO UPDATE SET tat = ?3,
      due_set = CASE WHEN ?4 IS NULL THEN due_set WHEN due IS NULL OR ?4 < due OR due_set > ?5 THEN ?5 ELSE due_set END,
      due = CASE WHEN ?4 IS NULL THEN due WHEN due IS NULL OR ?4 < due OR due_set > ?5 THEN ?4 ELSE due END
    """
  /// The keys whose held jobs are due at `?2` (`key_buckets_due`), or whose due time was noted by a
  /// clock later than `?2` (`key_buckets_due_set`: the clock stepped back since): key, bucket
  /// time; at most ``maximumKeysReleased``.
  static let dueKeys = """
    SELECT key, tat FROM key_buckets INDEXED BY key_buckets_due WHERE queue = ?1 AND due IS NOT NULL AND due <= ?2
    UNION
    SELECT key, tat FROM key_buckets INDEXED BY key_buckets_due_set
    WHERE queue = ?1 AND due IS NOT NULL AND due_set > ?2
    LIMIT \(maximumKeysReleased)
    """
  /// The most keys whose held jobs one claim makes ready (`QueueLimits` documents it).
  static let maximumKeysReleased = 1_000
  /// Sets (or clears, `?3` NULL) the time a key's held jobs are due, noted at `?4`.
  static let setKeyDue =
    "UPDATE key_buckets SET due = ?3, due_set = CASE WHEN ?3 IS NOT NULL THEN ?4 END WHERE queue = ?1 AND key = ?2"
  /// The first `?3` jobs a claim held for key `?2`, in claim order, are ready again.
  static let unparkKey = """
    UPDATE jobs SET status = 'ready', parked = NULL WHERE id IN (
      SELECT id FROM jobs INDEXED BY jobs_parked
      WHERE queue = ?1 AND limit_key = ?2 AND status = 'held' AND parked = 1
      ORDER BY priority DESC, coalesce(turn, run_at), seq, id LIMIT ?3)
    """
  /// Whether key `?2` still has jobs held.
  static let keyHasParked = """
    SELECT 1 FROM jobs INDEXED BY jobs_parked WHERE queue = ?1 AND limit_key = ?2 AND status = 'held' AND parked = 1
    LIMIT 1
    """
  /// The earliest time a key's held jobs are due (NULL: none), `?2` (now) when a due time was noted
  /// by a clock later than now.
  static let earliestKeyDue = """
    SELECT CASE WHEN EXISTS (
        SELECT 1 FROM key_buckets INDEXED BY key_buckets_due_set WHERE queue = ?1 AND due IS NOT NULL AND due_set > ?2)
      THEN ?2 ELSE (SELECT min(due) FROM key_buckets INDEXED BY key_buckets_due WHERE queue = ?1 AND due IS NOT NULL) END
    """
  /// Deletes up to 16 buckets full for a day by `?2` and holding nothing (as good as no row; a day
  /// of margin, so a claim whose clock is ahead of the others' deletes no bucket that still binds
  /// them).
  static let deleteFullBuckets = """
    DELETE FROM key_buckets WHERE queue = ?1 AND key IN (
      SELECT key FROM key_buckets INDEXED BY key_buckets_full
      WHERE queue = ?1 AND due IS NULL AND tat <= ?2 - 86400000000 LIMIT 16)
    """
  /// Forgets the queue's buckets (it has no rate per key).
  static let deleteKeyBuckets = "DELETE FROM key_buckets WHERE queue = ?"
  static let keyRateOverrides = "SELECT key, rate, burst FROM key_rates WHERE queue = ? ORDER BY key"
  static let deleteKeyRateOverrides = "DELETE FROM key_rates WHERE queue = ?"
  static let insertKeyRateOverride = "INSERT INTO key_rates (queue, key, rate, burst) VALUES (?, ?, ?, ?)"

  /// What version 12 adds to version 11: limits per key.
  /// - `jobs.limit_key`: the job's `NewJob.limitKey`.
  /// - `jobs.parked`: 1 while the job is `held` because a claim found its key at its limit (a
  ///   trigger clears it whenever the status leaves `held`, so `parked = 1` implies `held`).
  /// - `queues.key_concurrency`: `QueueLimits.keyConcurrency`; `key_limits`: its overrides.
  /// - `jobs_key_running`: a key's running jobs, counted by a claim up to the key's limit.
  /// - `jobs_parked`: a key's parked jobs in claim order, for the triggers that make the first
  ///   claimable again when a job of the key stops running, however it stops (settled, cancelled,
  ///   removed, rescued), and when a ready job of the key leaves the ready state other than by a
  ///   claim (cancelled, removed, replaced with a later run date): the job a stop made claimable
  ///   may go so, and its key's other held jobs would then wait for a stop that never comes. One
  ///   place for every path, in the same transaction. A claim's park (ready to held) and claim
  ///   (ready to running) make nothing claimable.
  static let version12 = """
    ALTER TABLE jobs ADD COLUMN limit_key TEXT;
    ALTER TABLE jobs ADD COLUMN parked INTEGER;
    ALTER TABLE queues ADD COLUMN key_concurrency INTEGER CHECK (key_concurrency BETWEEN 1 AND 1000000);
    CREATE TABLE key_limits (
      queue TEXT NOT NULL,
      key TEXT NOT NULL,
      concurrency INTEGER NOT NULL CHECK (concurrency BETWEEN 1 AND 1000000),
      PRIMARY KEY (queue, key)
    ) WITHOUT ROWID;
    CREATE INDEX jobs_key_running ON jobs (queue, limit_key) WHERE status = 'running' AND limit_key IS NOT NULL;
    CREATE INDEX jobs_parked ON jobs (queue, limit_key, priority DESC, run_at, seq, id)
      WHERE status = 'held' AND parked = 1;
    CREATE TRIGGER jobs_key_stopped AFTER UPDATE OF status ON jobs
    WHEN OLD.limit_key IS NOT NULL AND (
      (OLD.status = 'running' AND NEW.status <> 'running')
      OR (OLD.status = 'ready' AND NEW.status NOT IN ('running', 'held')))
    BEGIN
      \(unparkFirstVersion12)
    END;
    CREATE TRIGGER jobs_key_deleted AFTER DELETE ON jobs
    WHEN OLD.status IN ('running', 'ready') AND OLD.limit_key IS NOT NULL
    BEGIN
      \(unparkFirstVersion12)
    END;
    CREATE TRIGGER jobs_unparked AFTER UPDATE OF status ON jobs
    WHEN OLD.parked = 1 AND NEW.status <> 'held'
    BEGIN
      UPDATE jobs SET parked = NULL WHERE id = NEW.id;
    END;
    """
  /// In a trigger on a job of a limit key that stopped running or left the ready state (`OLD`): the
  /// first job a claim held for that key's limit, in claim order, is ready again (in its old place).
  private static let unparkFirst = """
    UPDATE jobs SET status = 'ready', parked = NULL WHERE id = (
        SELECT id FROM jobs INDEXED BY jobs_parked
        WHERE queue = OLD.queue AND limit_key = OLD.limit_key AND status = 'held' AND parked = 1
        ORDER BY priority DESC, coalesce(turn, run_at), seq, id LIMIT 1);
    """
  /// ``unparkFirst`` as version 12 created it (by run date, before turns); version 14 replaces it.
  private static let unparkFirstVersion12 = """
    UPDATE jobs SET status = 'ready', parked = NULL WHERE id = (
        SELECT id FROM jobs INDEXED BY jobs_parked
        WHERE queue = OLD.queue AND limit_key = OLD.limit_key AND status = 'held' AND parked = 1
        ORDER BY priority DESC, run_at, seq, id LIMIT 1);
    """
  /// A claim found the job's key at its limit: held until a job of the key stops running.
  static let park = "UPDATE jobs SET status = 'held', parked = 1 WHERE id = ? AND status = 'ready'"
  /// Every job of the queue held for its key's limit is ready again (the limits changed).
  static let unparkAll =
    "UPDATE jobs SET status = 'ready', parked = NULL WHERE queue = ? AND status = 'held' AND parked = 1"
  /// The running jobs of limit key `?2`, counted up to its limit `?3` (`jobs_key_running`).
  static let keyRunningCount = """
    SELECT count(*) FROM (
      SELECT 1 FROM jobs INDEXED BY jobs_key_running
      WHERE queue = ?1 AND limit_key = ?2 AND status = 'running' AND limit_key IS NOT NULL LIMIT ?3)
    """
  /// The limit of key `?2`: its override, else the queue's limit per key (no row or NULL: none).
  static let keyLimit = """
    SELECT coalesce((SELECT concurrency FROM key_limits WHERE queue = ?1 AND key = ?2), q.key_concurrency)
    FROM queues q WHERE q.name = ?1
    """
  /// The queue `?1`'s limit keys with running or held jobs (`jobs_key_running`, `jobs_parked`):
  /// key, running, held; most held first, then most running, then by bytes (`BINARY`); at most `?2`.
  static let limitKeyUsage = """
    SELECT limit_key, sum(running), sum(held) FROM (
      SELECT limit_key, 1 AS running, 0 AS held FROM jobs INDEXED BY jobs_key_running
      WHERE queue = ?1 AND status = 'running' AND limit_key IS NOT NULL
      UNION ALL
      SELECT limit_key, 0, 1 FROM jobs INDEXED BY jobs_parked WHERE queue = ?1 AND status = 'held' AND parked = 1)
    GROUP BY limit_key ORDER BY 3 DESC, 2 DESC, limit_key LIMIT ?2
    """
  static let keyOverrides = "SELECT key, concurrency FROM key_limits WHERE queue = ? ORDER BY key"
  static let deleteKeyOverrides = "DELETE FROM key_limits WHERE queue = ?"
  static let insertKeyOverride = "INSERT INTO key_limits (queue, key, concurrency) VALUES (?, ?, ?)"
  /// A schedule's columns, in the order `SQLiteJobStore.schedule(from:)` reads them.
  static let scheduleColumns = """
    queue, name, spacing, time_zone, catch_up, jitter_ms, payload, priority, time_limit_ms, origin, active,
    paused, created_at, last_slot, next_due, dedup_key, dedup_scope, on_conflict
    """
  static let schedulesOfQueue = "SELECT \(scheduleColumns) FROM schedules WHERE queue = ? ORDER BY name"
  static let allSchedules = "SELECT \(scheduleColumns) FROM schedules ORDER BY queue, name"
  static let scheduleNamed = "SELECT \(scheduleColumns) FROM schedules WHERE queue = ? AND name = ?"
  /// The due schedules, found in `schedules_due`.
  static let dueSchedules = """
    SELECT \(scheduleColumns) FROM schedules INDEXED BY schedules_due
    WHERE queue = ? AND next_due <= ? AND active = 1 AND paused = 0 ORDER BY name
    """
  /// A fired schedule's new last slot and due time (its definition is unchanged).
  static let advanceSchedule = "UPDATE schedules SET last_slot = ?, next_due = ? WHERE queue = ? AND name = ?"
  static let saveSchedule = """
    INSERT OR REPLACE INTO schedules (\(scheduleColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    """
  /// A schedule this build cannot read back (a newer release's), due for longer than the grace,
  /// is due again later, not never; before that it is left to the processes that can read it
  /// (see `JobStore.fireDueSchedules`). Parameters: due time, queue, name, the grace's start.
  static let postponeSchedule =
    "UPDATE schedules SET next_due = ? WHERE queue = ? AND name = ? AND next_due <= ?"
  static let deleteSchedule = "DELETE FROM schedules WHERE queue = ? AND name = ?"
  /// The earliest due time: the first entry of `schedules_due` for the queue.
  static let nextScheduleDue = """
    SELECT min(next_due) FROM schedules INDEXED BY schedules_due WHERE queue = ? AND active = 1 AND paused = 0
    """
  /// Of the jobs after `?1`, up to 100 in ID order whose last error is longer than a kept error
  /// may be, with its first characters: more characters than the bound has bytes, enough for
  /// `JobHistory.bounded` to cut it as it would cut the whole.
  static let longErrors = """
    SELECT id, substr(last_error, 1, \(JobHistory.maximumErrorBytes + 1)) FROM jobs
    WHERE id > ?1 AND length(CAST(last_error AS BLOB)) > \(JobHistory.maximumErrorBytes) ORDER BY id LIMIT 100
    """
  /// Parameters: the bounded error, the job.
  static let setErrors = "UPDATE jobs SET errors = json_array(?1) WHERE id = ?2"
  static let sequence = "SELECT seq FROM sqlite_sequence WHERE name = ?"
  static let setSequence = """
    INSERT INTO sqlite_sequence (name, seq) SELECT 'jobs', 0
    WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs');
    UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'jobs';
    """

  /// The application id, schema version and number of schema objects, read in one snapshot.
  static let inspect = """
    SELECT (SELECT application_id FROM pragma_application_id),
      (SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_master)
    """

  /// The columns ``SQLiteJobStore`` decodes a `JobRecord` from, in order.
  static let columns = """
    id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key, \
    lease_owner, lease_expires_at, claim_token, time_limit_ms, finished_at, errors, run_ms, output, ordering_key, \
    limit_key, parked, fairness_key
    """

  /// The oldest waiting job with the key. Running jobs do not count: one that is running may
  /// have read old data, so a new job with its key must run after it.
  static let findDuplicate = """
    SELECT min(id) FROM jobs WHERE queue = ? AND dedup_key = ? AND status IN ('ready', 'scheduled', 'held')
    """
  /// The oldest job of the key `?2` that runs, or that completed at or after `?3` (milliseconds;
  /// NULL: no completed job counts), for the wider deduplication scopes. `INDEXED BY`: a
  /// statement that could not use ``keyedIndex`` fails to prepare instead of scanning the table.
  static let findKeyed = """
    SELECT min(id) FROM jobs INDEXED BY jobs_keyed
    WHERE queue = ?1 AND dedup_key = ?2 AND dedup_key IS NOT NULL AND status IN ('running', 'completed')
      AND (status = 'running' OR finished_at >= ?3)
    """
  /// Gives the waiting job `?6` a new payload, priority, run date, state and time limit
  /// (`DeduplicationConflict.replace`); its place (`seq`), attempts, errors, ordering key and
  /// fairness key stay (a job with a fairness key takes a new turn if it is ready),
  /// and a job held behind its ordering key stays held (one held for its key's limit no longer
  /// is: the next claim holds it again if its key is still at its limit).
  static let replaceWaiting = """
    UPDATE jobs SET payload = ?1, priority = ?2, run_at = ?3,
      status = CASE WHEN status = 'held' AND parked IS NULL THEN 'held' ELSE ?4 END, time_limit_ms = ?5,
      turn = NULL
    WHERE id = ?6 AND status IN ('ready', 'scheduled', 'held')
    """
  /// Whether the line of the ordering key `?2` holds a job: a new job of the key is then held.
  static let lineTaken = """
    SELECT 1 FROM jobs INDEXED BY jobs_line WHERE queue = ?1 AND ordering_key = ?2 AND line = 1 LIMIT 1
    """
  /// The first job of the line of the ordering key `?2`, and its status.
  static let lineHead = """
    SELECT id, status, run_at, created_at FROM jobs INDEXED BY jobs_line
    WHERE queue = ?1 AND ordering_key = ?2 AND line = 1 ORDER BY id LIMIT 1
    """
  /// ``lineHead`` of the ordering key of job `?2` (of queue `?1`), which just left its line.
  static let lineHeadAfter = """
    SELECT id, status, run_at, created_at FROM jobs INDEXED BY jobs_line
    WHERE queue = ?1 AND ordering_key = (SELECT ordering_key FROM jobs WHERE id = ?2) AND line = 1
    ORDER BY id LIMIT 1
    """
  /// A held job whose turn came: ready (`?2`) or scheduled (`?3`, a claim makes it ready once
  /// its run date has come).
  static let unhold = "UPDATE jobs SET status = ?2, seq = 0 WHERE id = ?1 AND status = 'held'"
  /// The ordering key of a job in its key's line (NULL for any other), its status and queue, if
  /// it belongs to queue `?2` (any when NULL).
  static let orderingKeyOf = """
    SELECT CASE WHEN line = 1 THEN ordering_key END, status, queue FROM jobs
    WHERE id = ?1 AND (?2 IS NULL OR queue = ?2)
    """
  /// The status is a parameter here: an insert maintains the partial indexes row by row.
  static let insert = """
    INSERT INTO jobs (queue, payload, status, priority, run_at, created_at, dedup_key, time_limit_ms, ordering_key,
      line, limit_key, fairness_key)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    """
  /// The parameters of each row of ``insert``.
  static let insertColumns = 12
  /// ``insert`` for `rows` rows (1 to ``SQLiteJobStore/rowsPerInsert``) at once, returning each
  /// new row's ID (see ``SQLiteJobStore/insertTogether(_:rows:db:)``).
  static func insert(rows: Int) -> String { insertRows[rows] }
  private static let insertRows = (0...SQLiteJobStore.rowsPerInsert).map { rows in
    insert + String(repeating: ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", count: max(rows - 1, 0))
      + " RETURNING id"
  }
  /// Whether the SQLite library knows `RETURNING` (3.35 and later); ``insert(rows:)`` needs it.
  static let hasReturning = sqlite3_libversion_number() >= 3_035_000

  /// Every queue with jobs has a row, so ``queueNames`` never reads the jobs table.
  static let noteQueue = "INSERT OR IGNORE INTO queues (name) VALUES (?)"

  static let isPaused = "SELECT 1 FROM queues WHERE name = ? AND paused = 1"
  /// The pause flag, the concurrency limit, and the rate limit with its stored time, for a claim
  /// (no row: none of them).
  static let claimFlags = """
    SELECT paused, concurrency, rate, burst, rate_time,
      key_concurrency IS NOT NULL OR EXISTS (SELECT 1 FROM key_limits k WHERE k.queue = name),
      key_rate IS NOT NULL OR EXISTS (SELECT 1 FROM key_rates r WHERE r.queue = name)
    FROM queues WHERE name = ?
    """
  static let concurrency = "SELECT concurrency FROM queues WHERE name = ?"
  static let limits =
    "SELECT concurrency, rate, burst, key_concurrency, key_rate, key_burst FROM queues WHERE name = ?"
  /// Stores the limits (`?2` concurrency, `?3` rate, `?4` burst, `?5` limit per key, `?6` rate per
  /// key, `?7` its burst); the rate's stored time is kept while a rate is set, so changing the rate
  /// does not refill the bucket.
  static let setLimits = """
    INSERT INTO queues (name, concurrency, rate, burst, key_concurrency, key_rate, key_burst)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (name) DO UPDATE SET concurrency = ?2, rate = ?3, burst = ?4, key_concurrency = ?5,
      key_rate = ?6, key_burst = ?7, rate_time = CASE WHEN ?3 IS NULL THEN NULL ELSE rate_time END
    """
  /// Stores the rate's time after a claim took starts.
  static let setRateTime = "UPDATE queues SET rate_time = ?2 WHERE name = ?1"
  /// The queue's running jobs (those under a lease, or lapsed and not yet rescued), from
  /// `jobs_running`, counted up to the queue's concurrency limit `?2`: a claim under a limit
  /// reads at most the limit's worth of entries, however many run (a limit lowered far below
  /// them).
  static let runningCount = """
    SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ?1 AND status = 'running' LIMIT ?2)
    """
  static let pause = """
    INSERT INTO queues (name, paused) VALUES (?, 1) ON CONFLICT (name) DO UPDATE SET paused = 1
    """
  static let resume = "UPDATE queues SET paused = 0 WHERE name = ?"

  /// Scheduled jobs whose run date has come become ready (a range of `jobs_scheduled`).
  static let promote = """
    UPDATE jobs SET status = 'ready' WHERE queue = ? AND status = 'scheduled' AND run_at <= ?
    """
  static let selectReady = """
    SELECT \(columns) FROM jobs WHERE queue = ? AND status = 'ready'
    ORDER BY priority DESC, coalesce(turn, run_at), seq, id LIMIT ?
    """
  /// No `RETURNING`: SQLite buffers returned rows in an ephemeral table whose page cache is
  /// allocated and freed per statement, which dominated the claim's cost. The run date is kept,
  /// so a job given back or rescued keeps its place; the attempt count saturates instead of
  /// overflowing into a floating-point value.
  static let claim = """
    UPDATE jobs SET status = 'running',
    attempts = CASE WHEN attempts < 9223372036854775807 THEN attempts + 1 ELSE attempts END,
    claim_token = claim_token + 1, lease_owner = ?, lease_expires_at = ? WHERE id = ?
    """

  /// The fence: an outcome or heartbeat applies only to the job's current claim.
  private static let held = "id = ? AND queue = ? AND status = 'running' AND claim_token = ?"
  /// Deletes a job as it finishes (completed or dead) when its queue keeps no history of that
  /// status (`JobSettlement.keepsHistory` false).
  static let deleteHeld = "DELETE FROM jobs WHERE \(held)"
  /// ``deleteHeld`` for a job in no ordering key's line (one in a line changes nothing).
  static let deleteHeldOutOfLine = "DELETE FROM jobs WHERE \(held) AND line IS NULL"
  /// Parameters: now, run time (NULL: kept), output, then the claim. The job leaves its
  /// ordering key's line.
  static let complete = """
    UPDATE jobs SET status = 'completed', finished_at = ?, run_ms = coalesce(?, run_ms), output = ?,
    lease_owner = NULL, lease_expires_at = NULL, line = NULL WHERE \(held)
    """
  /// ``complete`` for a job in its ordering key's line (one in no line changes nothing).
  static let completeInLine = """
    UPDATE jobs SET status = 'completed', finished_at = ?, run_ms = coalesce(?, run_ms), output = ?,
    lease_owner = NULL, lease_expires_at = NULL, line = NULL WHERE \(held) AND line = 1
    """
  /// ``complete`` for a job in no ordering key's line (one in a line changes nothing): the usual
  /// completion, which then needs no lookup of a key.
  static let completeOutOfLine = """
    UPDATE jobs SET status = 'completed', finished_at = ?, run_ms = coalesce(?, run_ms), output = ?,
    lease_owner = NULL, lease_expires_at = NULL WHERE \(held) AND line IS NULL
    """
  /// `errors` with the error parameter `error` appended (nothing when it is NULL), keeping the
  /// latest ``JobHistory/maximumErrors``.
  static func appendError(_ error: String) -> String {
    """
    CASE WHEN \(error) IS NULL THEN errors WHEN errors IS NULL THEN json_array(\(error))
    WHEN json_array_length(errors) >= \(JobHistory.maximumErrors)
    THEN json_insert(json_remove(errors, '$[0]'), '$[#]', \(error))
    ELSE json_insert(errors, '$[#]', \(error)) END
    """
  }
  /// Parameters: run date, now, error, then the claim. A job retried straight into the ready
  /// state takes its queue's next place (``nextRetryPlace``, raised just before), so it goes
  /// behind every job ready when it was retried (``seqColumn``).
  /// ``appendError(_:)`` records the error in the job's history; parameter 7: the run time
  /// (NULL: kept).
  static let retry = """
    UPDATE jobs SET status = CASE WHEN ?1 <= ?2 THEN 'ready' ELSE 'scheduled' END, run_at = ?1, turn = NULL,
    seq = CASE WHEN ?1 <= ?2 THEN (SELECT retry_seq FROM queues WHERE name = ?6) ELSE 0 END,
    last_error = coalesce(?3, last_error), errors = \(appendError("?3")), run_ms = coalesce(?7, run_ms),
    lease_owner = NULL, lease_expires_at = NULL
    WHERE id = ?4 AND queue = ?6 AND status = 'running' AND claim_token = ?5
    """
  /// Parameters: error, now, run time (NULL: kept), then the claim.
  static let kill = """
    UPDATE jobs SET status = 'dead', last_error = ?1, errors = \(appendError("?1")), finished_at = ?2,
    run_ms = coalesce(?3, run_ms), lease_owner = NULL, lease_expires_at = NULL
    WHERE id = ?4 AND queue = ?5 AND status = 'running' AND claim_token = ?6
    """
  /// ``kill`` for a job that leaves its ordering key as it dies (`DeadHeadPolicy.releasesKey`): its
  /// key is cleared and it leaves the key's line.
  static let killReleasingKey = """
    UPDATE jobs SET status = 'dead', last_error = ?1, errors = \(appendError("?1")), finished_at = ?2,
    run_ms = coalesce(?3, run_ms), lease_owner = NULL, lease_expires_at = NULL, ordering_key = NULL, line = NULL
    WHERE id = ?4 AND queue = ?5 AND status = 'running' AND claim_token = ?6
    """
  /// Back to ready in its old place (its run date was at or before the claim), the attempt
  /// its claim counted given back.
  static let release = """
    UPDATE jobs SET status = 'ready', attempts = max(attempts - 1, 0),
    last_error = coalesce(?, last_error), lease_owner = NULL, lease_expires_at = NULL WHERE \(held)
    """
  static let heartbeat = "UPDATE jobs SET lease_expires_at = ? WHERE \(held)"
  /// A running job's new payload under its claim. Parameters: payload, then the claim.
  static let checkpoint = "UPDATE jobs SET payload = ? WHERE \(held)"
  /// Running jobs are few (those under a lease), read from `jobs_running`.
  static let rescue = """
    UPDATE jobs SET status = 'ready', lease_owner = NULL, lease_expires_at = NULL
    WHERE queue = ? AND status = 'running' AND lease_expires_at <= ?
    """

  /// A count over the status's own partial index.
  static func count(_ status: String) -> String {
    "SELECT count(*) FROM jobs WHERE queue = ? AND status = '\(status)'"
  }
  /// Scheduled jobs already due (counted as ready until a claim promotes them).
  static let countDue = """
    SELECT count(*) FROM jobs WHERE queue = ? AND status = 'scheduled' AND run_at <= ?
    """

  /// Any ready job: its run date is at or before now.
  static let anyReady = "SELECT run_at FROM jobs WHERE queue = ? AND status = 'ready' LIMIT 1"
  static let nextScheduled = "SELECT min(run_at) FROM jobs WHERE queue = ? AND status = 'scheduled'"
  static let nextExpiry = "SELECT min(lease_expires_at) FROM jobs WHERE queue = ? AND status = 'running'"
  /// One index seek per status and queue: each `EXISTS` reads a partial index.
  static let queueNames = """
    SELECT name FROM queues WHERE paused = 1 OR concurrency IS NOT NULL OR rate IS NOT NULL
    OR key_concurrency IS NOT NULL OR EXISTS (SELECT 1 FROM key_limits k WHERE k.queue = queues.name)
    OR key_rate IS NOT NULL OR EXISTS (SELECT 1 FROM key_rates r WHERE r.queue = queues.name)
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'ready')
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'scheduled')
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'held')
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'running')
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'dead')
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'completed')
    OR EXISTS (SELECT 1 FROM jobs WHERE jobs.queue = queues.name AND status = 'cancelled')
    ORDER BY name
    """

  /// A page of jobs in ID order. Running and dead jobs come from their partial indexes;
  /// waiting jobs (and all jobs) from the table in ID order, where `+status` keeps SQLite from
  /// reading a whole partial index and sorting it.
  static func list(_ status: JobStatus?) -> String {
    let filter: String
    switch status {
    case nil: filter = ""
    case .pending: filter = "AND +status IN ('ready', 'scheduled', 'held')"
    case .running: filter = "AND status = 'running'"
    case .dead: filter = "AND status = 'dead'"
    case .completed, .cancelled: return history(status!, after: true)
    }
    return "SELECT \(columns) FROM jobs WHERE queue = ? AND id > ? \(filter) ORDER BY id LIMIT ?"
  }

  /// A page of a finished status's jobs in the order they finished (its index): from the
  /// start (parameters queue, limit), or after a job's finishing time and ID (parameters queue,
  /// finishing time, ID, limit).
  static func history(_ status: JobStatus, after: Bool) -> String {
    let stored = stored(status)[0]
    let from = after ? "AND (finished_at, id) > (?2, ?3)" : ""
    return """
      SELECT \(columns) FROM jobs WHERE queue = ?1 AND status = '\(stored)' \(from)
      ORDER BY finished_at, id LIMIT ?\(after ? 4 : 2)
      """
  }

  /// A finished job's finishing time, when it has status `?2` and is of queue `?3` (a history
  /// page's cursor).
  static let finishedAt = "SELECT finished_at FROM jobs WHERE id = ?1 AND status = ?2 AND queue = ?3"

  /// The stored statuses a public status covers.
  static func stored(_ status: JobStatus) -> [String] {
    switch status {
    case .pending: ["ready", "scheduled", "held"]
    case .running: ["running"]
    case .dead: ["dead"]
    case .completed: ["completed"]
    case .cancelled: ["cancelled"]
    }
  }

  /// Deletes a batch of a finished status's oldest jobs, finished before a time (its index).
  /// Parameters: queue, before, limit.
  static func prune(_ status: String) -> String {
    """
    DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE queue = ?1 AND status = '\(status)'
    AND finished_at < ?2 ORDER BY finished_at LIMIT ?3) RETURNING CASE WHEN line = 1 THEN ordering_key END
    """
  }
  /// Deletes a batch of a finished status's oldest jobs, whenever they finished. Parameters:
  /// queue, limit.
  static func pruneAll(_ status: String) -> String {
    """
    DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE queue = ?1 AND status = '\(status)'
    ORDER BY finished_at LIMIT ?2) RETURNING CASE WHEN line = 1 THEN ordering_key END
    """
  }

  /// One job by its ID: a primary-key lookup (the dashboard's job page).
  static let job = "SELECT \(columns) FROM jobs WHERE id = ?"

  static let remove = "DELETE FROM jobs WHERE id = ? AND queue = ?"
  /// A job's status, if it belongs to queue `?2` (any when NULL; compared byte for byte), for
  /// ``SQLiteJobStore/cancel(_:queue:clock:)``.
  static let statusInQueue = "SELECT status FROM jobs WHERE id = ?1 AND (?2 IS NULL OR queue = ?2)"
  /// Parameters: now, ID.
  static let cancel = """
    UPDATE jobs SET status = 'cancelled', finished_at = ?, lease_owner = NULL, lease_expires_at = NULL,
    line = NULL WHERE id = ?
    """
  /// Whether a claim is current (``SQLiteJobStore/currentClaims(_:queue:)``): parameters ID,
  /// queue, token.
  static let isCurrent = "SELECT 1 FROM jobs WHERE \(held)"

  static func clear(_ status: String) -> String {
    "DELETE FROM jobs WHERE queue = ? AND status = '\(status)' RETURNING CASE WHEN line = 1 THEN ordering_key END"
  }

  /// The count and highest ID of a status's jobs (its partial index).
  static func tally(_ status: String) -> String {
    "SELECT count(*), max(id) FROM jobs WHERE queue = ? AND status = '\(status)'"
  }
  /// The count of a status's jobs with IDs up to a bound.
  static func countThrough(_ status: String) -> String {
    "SELECT count(*) FROM jobs WHERE queue = ? AND status = '\(status)' AND id <= ?"
  }
  /// Deletes a status's jobs with IDs up to a bound.
  static func clearThrough(_ status: String) -> String {
    "DELETE FROM jobs WHERE queue = ? AND status = '\(status)' AND id <= ? RETURNING CASE WHEN line = 1 THEN ordering_key END"
  }

  /// What re-queueing sets; the first parameter is the run date.
  /// A dead job that is not the first of its ordering key's line goes back held.
  private static let requeued = """
    UPDATE jobs SET status = CASE WHEN ordering_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM jobs AS first INDEXED BY jobs_line WHERE first.queue = jobs.queue
        AND first.ordering_key = jobs.ordering_key AND first.line = 1 AND first.id < jobs.id)
      THEN 'held' ELSE 'ready' END,
    run_at = ?, seq = 0, turn = NULL, attempts = 0, lease_owner = NULL, lease_expires_at = NULL, finished_at = NULL
    """
  /// Re-queues every dead job without a deduplication key (the keyed ones go one at a time).
  static let requeueAllWithoutKey = """
    \(requeued) WHERE queue = ? AND status = 'dead' AND dedup_key IS NULL
    """
  static let deadWithKey = """
    SELECT id FROM jobs WHERE queue = ? AND status = 'dead' AND dedup_key IS NOT NULL ORDER BY id
    """
  /// Re-queues one dead job unless a waiting job holds its deduplication key.
  static let requeueOne = """
    \(requeued) WHERE queue = ? AND status = 'dead' AND id = ?
    AND (dedup_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM jobs AS live WHERE live.queue = jobs.queue AND live.dedup_key = jobs.dedup_key
      AND live.status IN ('ready', 'scheduled', 'held')))
    """
}
