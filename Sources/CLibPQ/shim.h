#ifndef CONVEYOR_CLIBPQ_SHIM_H
#define CONVEYOR_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <poll.h>

// The PG_DIAG_* field codes are character-literal macros, which Swift does not import.
static inline char *conveyor_pq_sqlstate(const PGresult *result) {
  return PQresultErrorField(result, PG_DIAG_SQLSTATE);
}
static inline char *conveyor_pq_primary_message(const PGresult *result) {
  return PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
}

// A notice processor that drops notices ("schema already exists, skipping"), which libpq would
// otherwise print to standard error.
static void conveyor_pq_ignore_notice(void *arg, const char *message) { (void)arg; (void)message; }
static inline void conveyor_pq_silence_notices(PGconn *connection) {
  PQsetNoticeProcessor(connection, conveyor_pq_ignore_notice, (void *)0);
}

// Waits until the connection's socket is readable or `timeout_ms` passes (poll(2) on one descriptor).
static inline int conveyor_pq_wait_readable(int socket, int timeout_ms) {
  struct pollfd descriptor = {socket, POLLIN, 0};
  return poll(&descriptor, 1, timeout_ms);
}
#endif
