/* What the C test programs share: CHECK counts a failed condition and
 * prints it with the API's last error; summary() ends the program;
 * try_connect() connects a new engine to a peer. */

#ifndef ORBITTE_TEST_CHECK_H
#define ORBITTE_TEST_CHECK_H

#include <stdio.h>

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

#endif
