#ifndef CONVEYOR_CSQLITE_SHIM_H
#define CONVEYOR_CSQLITE_SHIM_H
#include <sqlite3.h>

// SQLITE_TRANSIENT is a macro casting -1 to a function pointer, which Swift cannot import.
static inline sqlite3_destructor_type conveyor_sqlite_transient(void) { return SQLITE_TRANSIENT; }
static inline sqlite3_destructor_type conveyor_sqlite_static(void) { return SQLITE_STATIC; }

// sqlite3_db_config is variadic; wrap the calls Conveyor needs.
static inline int conveyor_sqlite_db_config_no_checkpoint_on_close(sqlite3 *db, int on) {
  return sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, on, (int *)0);
}
#endif
