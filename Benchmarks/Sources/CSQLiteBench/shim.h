#include <sqlite3.h>
static inline sqlite3_destructor_type bench_sqlite_transient(void) { return SQLITE_TRANSIENT; }
static inline sqlite3_destructor_type bench_sqlite_static(void) { return SQLITE_STATIC; }
