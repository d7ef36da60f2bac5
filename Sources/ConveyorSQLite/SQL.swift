import Conveyor

/// The store's schema and statements.
///
/// Statuses are written as literals, not parameters, so SQLite can use the partial indexes.
enum SQL {
  static let schema = """
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      queue TEXT NOT NULL,
      payload BLOB NOT NULL,
      status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'dead')),
      priority INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      run_at INTEGER NOT NULL,
      created_at INTEGER NOT NULL,
      last_error TEXT,
      dedup_key TEXT,
      lease_owner TEXT,
      lease_expires_at INTEGER
    );
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';
    CREATE INDEX jobs_dedup ON jobs (queue, dedup_key)
      WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running');
    CREATE INDEX jobs_lease ON jobs (queue, lease_expires_at) WHERE status = 'running';
    CREATE INDEX jobs_dead ON jobs (queue, id) WHERE status = 'dead';
    CREATE TABLE queues (name TEXT PRIMARY KEY, paused INTEGER NOT NULL DEFAULT 1) WITHOUT ROWID;
    PRAGMA application_id = \(SQLiteJobStore.applicationID);
    PRAGMA user_version = \(SQLiteJobStore.schemaVersion);
    """

  /// The application id, schema version and number of schema objects, read in one snapshot.
  static let inspect = """
    SELECT (SELECT application_id FROM pragma_application_id),
      (SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_master)
    """

  /// The columns ``SQLiteJobStore`` decodes a `JobRecord` from, in order.
  static let columns = """
    id, queue, payload, status, priority, attempts, run_at, created_at, last_error, dedup_key, \
    lease_owner, lease_expires_at
    """

  static let findDuplicate = """
    SELECT id FROM jobs WHERE queue = ? AND dedup_key = ? AND status IN ('pending', 'running') LIMIT 1
    """
  static let insert = """
    INSERT INTO jobs (queue, payload, status, priority, run_at, created_at, dedup_key)
    VALUES (?, ?, 'pending', ?, ?, ?, ?)
    """

  static let isPaused = "SELECT paused FROM queues WHERE name = ? AND paused = 1"
  static let pause = "INSERT OR REPLACE INTO queues (name, paused) VALUES (?, 1)"
  static let resume = "DELETE FROM queues WHERE name = ?"

  /// Claims walk the priority levels from the highest down, each an index seek, and read the
  /// ready rows of one level at a time in (run_at, id) order: one query ordered by
  /// (priority DESC, run_at, id) with `run_at <= ?` would scan every not-yet-due job of every
  /// higher priority on each claim.
  static let topPriority = "SELECT max(priority) FROM jobs WHERE queue = ? AND status = 'pending'"
  static let lowerPriority = """
    SELECT max(priority) FROM jobs WHERE queue = ? AND status = 'pending' AND priority < ?
    """
  static let selectReady = """
    SELECT \(columns) FROM jobs
    WHERE queue = ? AND status = 'pending' AND priority = ? AND run_at <= ?
    ORDER BY run_at, id LIMIT ?
    """
  /// No `RETURNING`: SQLite buffers returned rows in an ephemeral table whose page cache is
  /// allocated and freed per statement, which dominated the claim's cost.
  static let claim = """
    UPDATE jobs SET status = 'running', attempts = attempts + 1, run_at = ?, lease_owner = ?,
    lease_expires_at = ? WHERE id = ?
    """

  private static let held = "id = ? AND queue = ? AND status = 'running' AND lease_owner = ?"
  static let complete = "DELETE FROM jobs WHERE \(held)"
  static let retry = """
    UPDATE jobs SET status = 'pending', run_at = ?, last_error = coalesce(?, last_error),
    lease_owner = NULL, lease_expires_at = NULL WHERE \(held)
    """
  static let kill = """
    UPDATE jobs SET status = 'dead', last_error = ?, lease_owner = NULL, lease_expires_at = NULL
    WHERE \(held)
    """
  static let release = """
    UPDATE jobs SET status = 'pending', attempts = max(attempts - 1, 0), lease_owner = NULL,
    lease_expires_at = NULL WHERE \(held)
    """
  static let heartbeat = "UPDATE jobs SET lease_expires_at = ? WHERE \(held)"
  static let rescue = """
    UPDATE jobs SET status = 'pending', run_at = ?, lease_owner = NULL, lease_expires_at = NULL
    WHERE queue = ? AND status = 'running' AND lease_expires_at < ?
    """

  /// Pending jobs, and how many of them are scheduled after the given date, in one index scan.
  static let countPending = """
    SELECT count(*), coalesce(sum(run_at > ?), 0) FROM jobs WHERE queue = ? AND status = 'pending'
    """
  static let countRunning = "SELECT count(*) FROM jobs WHERE queue = ? AND status = 'running'"
  static let countDead = "SELECT count(*) FROM jobs WHERE queue = ? AND status = 'dead'"

  /// The earliest pending run date. The ready index is ordered by priority first, so a plain
  /// `min(run_at)` would read every pending job; this walks the distinct priorities instead (one
  /// index seek each) and takes the earliest run date of each.
  static let nextRunAt = """
    WITH RECURSIVE levels(priority) AS (
      SELECT max(priority) FROM jobs WHERE queue = ?1 AND status = 'pending'
      UNION ALL
      SELECT (SELECT max(priority) FROM jobs
              WHERE queue = ?1 AND status = 'pending' AND priority < levels.priority)
      FROM levels WHERE levels.priority IS NOT NULL
    )
    SELECT min((SELECT min(run_at) FROM jobs
                WHERE queue = ?1 AND status = 'pending' AND priority = levels.priority))
    FROM levels WHERE levels.priority IS NOT NULL
    """
  static let nextExpiry =
    "SELECT min(lease_expires_at) FROM jobs WHERE queue = ? AND status = 'running'"
  static let queueNames = "SELECT queue FROM jobs UNION SELECT name FROM queues ORDER BY 1"

  /// A page of jobs in ID order. For pending jobs `+status` keeps SQLite on the rowid order (no
  /// sort of every pending job); running jobs (few: those under a lease) come from their partial
  /// index and are sorted; dead jobs have their own index in ID order.
  static func list(_ status: JobStatus?) -> String {
    let filter: String
    switch status {
    case nil: filter = ""
    case .pending: filter = "AND +status = 'pending'"
    case .running: filter = "AND status = 'running'"
    case .dead: filter = "AND status = 'dead'"
    }
    return "SELECT \(columns) FROM jobs WHERE queue = ? AND id > ? \(filter) ORDER BY id LIMIT ?"
  }

  static let remove = "DELETE FROM jobs WHERE id = ? AND queue = ?"

  static func clear(_ status: JobStatus) -> String {
    "DELETE FROM jobs WHERE queue = ? AND status = '\(status.rawValue)'"
  }

  /// What re-queueing sets; the first parameter is the run date.
  private static let requeued = """
    UPDATE jobs SET status = 'pending', run_at = ?, attempts = 0, lease_owner = NULL,
    lease_expires_at = NULL
    """
  /// Re-queues every dead job without a deduplication key (the keyed ones go one at a time).
  static let requeueAllWithoutKey = """
    \(requeued) WHERE queue = ? AND status = 'dead' AND dedup_key IS NULL
    """
  static let deadWithKey = """
    SELECT id FROM jobs WHERE queue = ? AND status = 'dead' AND dedup_key IS NOT NULL ORDER BY id
    """
  /// Re-queues one dead job unless a pending or running job holds its deduplication key.
  static let requeueOne = """
    \(requeued) WHERE queue = ? AND status = 'dead' AND id = ?
    AND (dedup_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM jobs AS live WHERE live.queue = jobs.queue AND live.dedup_key = jobs.dedup_key
      AND live.status IN ('pending', 'running')))
    """
}
