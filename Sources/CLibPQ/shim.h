#ifndef CONVEYOR_CLIBPQ_SHIM_H
#define CONVEYOR_CLIBPQ_SHIM_H
#include <libpq-fe.h>
#include <poll.h>
#include <string.h>

// The PG_DIAG_* field codes are character-literal macros, which Swift does not import.
static inline char *conveyor_pq_sqlstate(const PGresult *result) {
  return PQresultErrorField(result, PG_DIAG_SQLSTATE);
}
static inline char *conveyor_pq_primary_message(const PGresult *result) {
  return PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY);
}

// A notice receiver that drops notices ("schema already exists, skipping"), which libpq would
// otherwise print to standard error, and sets the int `ended` points to when one is FATAL or
// PANIC: libpq passes an error the server sends while the connection is idle (the server ending
// the session: `pg_terminate_backend`, a shutdown, an idle timeout) to the notice receiver, and
// the connection's status stays OK until a later read finds the socket closed (over TLS, a
// close_notify record comes first, so even a peek at the socket does not show the close).
static void conveyor_pq_receive_notice(void *ended, const PGresult *result) {
  const char *severity = PQresultErrorField(result, PG_DIAG_SEVERITY_NONLOCALIZED);
  if (ended && severity && (strcmp(severity, "FATAL") == 0 || strcmp(severity, "PANIC") == 0)) {
    *(int *)ended = 1;
  }
}
static inline void conveyor_pq_watch_notices(PGconn *connection, int *ended) {
  PQsetNoticeReceiver(connection, conveyor_pq_receive_notice, ended);
}

// Waits until the connection's socket is readable or `timeout_ms` passes (poll(2) on one descriptor).
static inline int conveyor_pq_wait_readable(int socket, int timeout_ms) {
  struct pollfd descriptor = {socket, POLLIN, 0};
  return poll(&descriptor, 1, timeout_ms);
}
#endif
