/* What the C test programs share: CHECK counts a failed condition and
 * prints it with the API's last error; summary() ends the program;
 * try_connect() connects a new engine to a peer; MUST ends the program on
 * a failed call; run() posts a transfer and checks it to its end;
 * wait_notif() polls for a notification. */

#ifndef ORBITTE_TEST_CHECK_H
#define ORBITTE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orbitte.h"

static int failures = 0;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);             \
            fprintf(stderr, __VA_ARGS__);                                    \
            const char *why = orbitte_last_error();                          \
            fprintf(stderr, " (last error: %s)\n", why ? why : "none");     \
            failures++;                                                      \
        }                                                                    \
    } while (0)

/* The exit status: 0 when every check held. */
static inline int summary(void) {
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}

/* Connects a new engine named `name`, made with `secret_file` (NULL:
 * $ORBITTE_SECRET_FILE), to the one whose connection info is `info`;
 * returns the code of orbitte_connect (printed with the message when it
 * failed). */
static inline int32_t try_connect(const char *name, const char *secret_file,
                                  const uint8_t *info, size_t info_len) {
    orbitte_engine *e = NULL;
    int32_t rc = orbitte_engine_create(name, NULL, secret_file, 0, &e);
    if (rc != ORBITTE_OK) return rc;
    orbitte_peer p = 0;
    rc = orbitte_connect(e, info, info_len, &p);
    if (rc != ORBITTE_OK) printf("%s: %d: %s\n", name, rc, orbitte_last_error());
    orbitte_engine_destroy(e);
    return rc;
}

#define MUST(call)                                                           \
    do {                                                                     \
        int32_t rc_ = (call);                                                \
        if (rc_ != ORBITTE_OK) {                                             \
            const char *why = orbitte_last_error();                          \
            fprintf(stderr, "FAIL %s:%d: %s = %d: %s\n", __FILE__, __LINE__, \
                    #call, rc_, why ? why : "(no message)");                 \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Posts a prepared transfer and checks it until it ends (at most 10 s). */
static inline int32_t run(orbitte_engine *e, orbitte_xfer x, const char *notif,
                   orbitte_xfer_status *st) {
    int32_t rc = orbitte_xfer_post(e, x, (const uint8_t *)notif,
                                   notif ? strlen(notif) : 0);
    double end = now_s() + 10.0;
    while (rc == ORBITTE_IN_PROGRESS && now_s() < end) {
        rc = orbitte_xfer_check(e, x, st);
    }
    orbitte_xfer_check(e, x, st);
    return rc;
}

/* Polls until a notification arrives (at most 10 s); returns its length,
 * or -1. The sender's name goes to `name`. */
static inline long wait_notif(orbitte_engine *e, char *name, size_t name_cap,
                       uint8_t *msg) {
    double end = now_s() + 10.0;
    while (now_s() < end) {
        size_t name_len = 0, msg_len = 0;
        int32_t rc = orbitte_notif_poll(e, (uint8_t *)name, name_cap, &name_len,
                                        msg, ORBITTE_MAX_NOTIF_LEN, &msg_len);
        if (rc == ORBITTE_OK) return (long)msg_len;
        if (rc != ORBITTE_EMPTY) return -1;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return -1;
}

#endif
