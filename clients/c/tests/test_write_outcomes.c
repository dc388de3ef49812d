/* libcod's write outcomes against a live `cod rm` whose SKB engine this program stops (SIGSTOP)
 * and lets go on (SIGCONT): a write the daemon could not answer in time is COD_EUNKNOWN, never a
 * failure; cod_retry learns its outcome and never applies it twice (docs/protocol.md, "Write
 * outcomes").  The daemon must answer a write within a few seconds (query_timeout_s = 1: 3 s).
 *
 *   test_write_outcomes SOCKET ENGINE_PID
 *
 * The last line of output is "N passed, N failed"; the exit status is 0 when none failed.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "cod.h"

static int passed, failed;
static const char *current = "";

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if ((cond) != 0) {                                                                 \
            passed++;                                                                      \
        } else {                                                                           \
            failed++;                                                                      \
            fprintf(stderr, "FAIL [%s] %s:%d: %s: ", current, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

static const char *sock;
static pid_t engine;

/* How many solutions a goal has (-1: the query failed). */
static long count(cod_conn *c, const char *goal)
{
    cod_reply *r = cod_query_goal(c, goal, NULL);
    long n = r ? (long)cod_reply_count(r) : -1;
    cod_reply_free(r);
    return n;
}

static int is_hex_key(const char *key)
{
    if (!key || strlen(key) != 32)
        return 0;
    for (const char *p = key; *p; p++)
        if (!strchr("0123456789abcdef", *p))
            return 0;
    return 1;
}

/* The daemon could not answer in time: COD_EUNKNOWN; the retry's answer is the first outcome. */
static void test_stopped_engine(void)
{
    current = "stopped engine";
    cod_conn *c = cod_connect(sock, "c_wo1"), *other = cod_connect(sock, "c_wo1");
    CHECK(c && other, "connected: %s", cod_connect_error());
    if (!c || !other)
        return;
    CHECK(cod_retry(c) == COD_EINVAL && cod_request_key(c) == NULL, "nothing to retry yet: %s", cod_errstr(c));
    CHECK(cod_add_fact(c, "seen(1)") == 0, "%s", cod_errstr(c));
    kill(engine, SIGSTOP);
    int rc = cod_remove_facts(c, "seen(_)");
    kill(engine, SIGCONT);
    CHECK(rc == COD_EUNKNOWN && cod_server_code(c) == -32080, "not a failure: %d %s", rc, cod_errstr(c));
    CHECK(is_hex_key(cod_request_key(c)), "its request key: %s", cod_request_key(c) ? cod_request_key(c) : "none");
    CHECK(strstr(cod_errstr(c), "may still be applied") != NULL, "says so: %s", cod_errstr(c));
    /* Behind the removal still under way (one uid's writes keep their order). */
    CHECK(cod_add_fact(other, "seen(2)") == 0, "%s", cod_errstr(other));
    rc = cod_retry(c);
    CHECK(rc == 1, "the first outcome: %d %s", rc, cod_errstr(c));
    CHECK(count(c, "seen(2)") == 1, "seen(2), added after the removal, was not removed by its retry");
    CHECK(count(c, "seen(1)") == 0, "the removal took effect once");
    CHECK(cod_retry(c) == COD_EINVAL, "a known outcome is not retried: %s", cod_errstr(c));
    cod_free(other);
    cod_free(c);
}

/* No reply within the call's timeout: COD_EUNKNOWN too (the request had left), then learnt. */
static void test_client_timeout(void)
{
    current = "client timeout";
    cod_conn *c = cod_connect(sock, "c_wo2");
    CHECK(c != NULL, "connected: %s", cod_connect_error());
    if (!c)
        return;
    cod_set_timeout(c, 500);
    kill(engine, SIGSTOP);
    int rc = cod_add_fact(c, "late(1)");
    kill(engine, SIGCONT);
    CHECK(rc == COD_EUNKNOWN && cod_server_code(c) == 0, "unknown, from the client: %d %s", rc, cod_errstr(c));
    CHECK(is_hex_key(cod_request_key(c)), "kept for cod_retry");
    cod_set_timeout(c, 30000);
    rc = cod_retry(c);
    CHECK(rc == 0, "learnt: %d %s", rc, cod_errstr(c));
    CHECK(count(c, "late(1)") == 1, "applied once");
    cod_reply *held = cod_held_state(c);
    char *json = held ? cod_value_json(cod_value_get(cod_reply_result(held), "facts")) : NULL;
    CHECK(json && strcmp(json, "[\"late(1)\"]") == 0, "held once known (a reconnection restores it): %s",
          json ? json : "none");
    free(json);
    cod_reply_free(held);
    cod_free(c);
}

/* A key of the caller's own through cod_call: the second request gets the first outcome. */
static void test_own_key(void)
{
    current = "own key";
    cod_conn *c = cod_connect(sock, "c_wo3");
    CHECK(c != NULL, "connected: %s", cod_connect_error());
    if (!c)
        return;
    const char *params = "{\"facts\": [\"k(1)\"], \"request_key\": \"mine-1\"}";
    for (int i = 0; i < 2; i++) {
        cod_reply *r = cod_call(c, "add_facts", params);
        long long added = -1;
        CHECK(r && cod_value_int(cod_value_get(cod_reply_result(r), "added"), &added) == 0 && added == 1,
              "call %d: added %lld (%s)", i, added, r ? "" : cod_errstr(c));
        cod_reply_free(r);
    }
    cod_reply *r = cod_call(c, "add_facts", "{\"facts\": [\"k(2)\"], \"request_key\": \"mine-1\"}");
    CHECK(!r && cod_errcode(c) == COD_EPARAMS && strstr(cod_errstr(c), "another request"),
          "one key, one request: %s", cod_errstr(c));
    cod_reply_free(r);
    CHECK(cod_error_from_server(-32080) == COD_EUNKNOWN, "the code");
    CHECK(strcmp(cod_strerror(COD_EUNKNOWN), "outcome of the write unknown") == 0, "its name");
    cod_free(c);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOCKET ENGINE_PID\n", argv[0]);
        return 2;
    }
    sock = argv[1];
    engine = (pid_t)atol(argv[2]);
    test_stopped_engine();
    test_client_timeout();
    test_own_key();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
