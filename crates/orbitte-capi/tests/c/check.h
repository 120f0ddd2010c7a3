/* What the C test programs share: CHECK counts a failed condition and
 * prints it with the API's last error; summary() ends the program. */

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

#endif
