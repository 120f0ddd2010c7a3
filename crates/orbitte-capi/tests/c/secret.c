/* The cluster secret: an engine created with no secret file reads the one
 * $ORBITTE_SECRET_FILE names. Run with that variable set to a secret file;
 * argv[1] is the same secret in another file, argv[2] a different secret.
 * Exits 0 when every check held. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orbitte.h"
#include "check.h"

int main(int argc, char **argv) {
    if (argc != 3 || !getenv("ORBITTE_SECRET_FILE")) {
        fprintf(stderr, "usage: ORBITTE_SECRET_FILE=FILE secret SAME_SECRET_FILE OTHER_SECRET_FILE\n");
        return 2;
    }
    orbitte_engine *guarded = NULL;
    if (orbitte_engine_create("guarded", "127.0.0.1:0", NULL, 0, &guarded) != ORBITTE_OK) {
        fprintf(stderr, "FAIL: create: %s\n", orbitte_last_error());
        return 1;
    }
    uint8_t info[1024];
    size_t info_len = 0;
    CHECK(orbitte_conn_info(guarded, info, sizeof info, &info_len) == ORBITTE_OK, "conn info");

    int32_t rc = try_connect("friend", argv[1], info, info_len);
    CHECK(rc == ORBITTE_OK, "the same secret, from a file named by the caller, is let in: %d", rc);
    rc = try_connect("friend-by-env", NULL, info, info_len);
    CHECK(rc == ORBITTE_OK, "the same secret, from $ORBITTE_SECRET_FILE, is let in: %d", rc);
    rc = try_connect("stranger", argv[2], info, info_len);
    CHECK(rc != ORBITTE_OK, "another secret is kept out");

    orbitte_engine *e = NULL;
    rc = orbitte_engine_create("no-file", NULL, "/nonexistent/orbitte-secret", 0, &e);
    const char *why = orbitte_last_error();
    CHECK(rc == ORBITTE_ERR_INVALID_PARAM && why && strstr(why, "cannot read"),
          "a secret file that cannot be read: %d", rc);
    printf("unreadable: %d: %s\n", rc, why ? why : "(none)");

    orbitte_engine_destroy(guarded);
    return summary();
}
