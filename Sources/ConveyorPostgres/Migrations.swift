import Conveyor

/// Creates and migrates the schema, once per database however many processes open it at once.
enum Migrations {
  /// Applies the migrations this build knows and the database lacks, in one transaction under an
  /// advisory lock on the schema's name; a second process waits for the first and then finds
  /// nothing to do. A database at a newer version is refused and left untouched (the transaction
  /// is rolled back before anything is created). `beforeEachStatement` runs before each statement
  /// that may wait long (the lock, each migration): the opening restarts its deadline there.
  ///
  /// - Returns: The version the schema was at when the lock was taken, and the version it is at
  ///   now (the same when there was nothing to apply).
  @discardableResult
  static func apply(
    _ sql: SQL, schemaName: String, on db: Connection, beforeEachStatement: () -> Void = {}
  ) throws -> (from: Int, to: Int) {
    try db.transaction {
      beforeEachStatement()
      try db.execute(SQL.migrationLock, [.text(schemaName)])
      var version: Int64 = 0
      beforeEachStatement()
      if try db.execute(sql.migrationTableExists).bool(0, 0) {
        version = try db.execute(sql.currentVersion).int64(0, 0)
      }
      let known = Int64(sql.migrations.count)
      guard version <= known else {
        throw PostgresError(
          code: .newerSchema,
          message: "the schema \"\(schemaName)\" has Conveyor schema version \(version), newer than the "
            + "version \(known) this build knows; it was left untouched")
      }
      guard version < known else { return (Int(version), Int(version)) }
      beforeEachStatement()
      try db.executeScript(sql.migrationTable)
      for index in Int(version)..<Int(known) {
        beforeEachStatement()
        try db.executeScript(sql.migrations[index])
        try db.execute(sql.recordVersion, [.int64(Int64(index + 1))])
      }
      return (Int(version), Int(known))
    }
  }
}
