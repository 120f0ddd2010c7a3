/* The listener token: an engine created with ORBITTE_ENGINE_TOKEN puts a
 * token in its connection info and lets in only peers that connect with
 * it. Exits 0 when every check held. */

#include <stdio.h>
#include <string.h>

#include "orbitte.h"
#include "check.h"

/* Connects a new engine to the one whose connection info is `info`;
 * returns the code of orbitte_connect. */
static int32_t try_connect(const char *name, const uint8_t *info, size_t info_len) {
    orbitte_engine *e = NULL;
    int32_t rc = orbitte_engine_create(name, NULL, NULL, 0, &e);
    if (rc != ORBITTE_OK) return rc;
    orbitte_peer p = 0;
    rc = orbitte_connect(e, info, info_len, &p);
    if (rc != ORBITTE_OK) printf("%s: %d: %s\n", name, rc, orbitte_last_error());
    orbitte_engine_destroy(e);
    return rc;
}

int main(void) {
    orbitte_engine *guarded = NULL;
    if (orbitte_engine_create("guarded", "127.0.0.1:0", NULL, ORBITTE_ENGINE_TOKEN, &guarded) !=
        ORBITTE_OK) {
        fprintf(stderr, "FAIL: create: %s\n", orbitte_last_error());
        return 1;
    }
    char info[1024];
    size_t info_len = 0;
    CHECK(orbitte_conn_info(guarded, (uint8_t *)info, sizeof info - 1, &info_len) == ORBITTE_OK,
          "conn info");
    info[info_len] = '\0';
    char *token = strstr(info, "\"token\":\"");
    CHECK(token != NULL, "the connection info carries the token: %s", info);
    if (token == NULL) return summary();

    int32_t rc = try_connect("holder", (const uint8_t *)info, info_len);
    CHECK(rc == ORBITTE_OK, "a peer with the connection info is let in: %d", rc);

    /* Another token: one hexadecimal digit changed. */
    char *digit = token + strlen("\"token\":\"");
    char saved = *digit;
    *digit = saved == '0' ? '1' : '0';
    rc = try_connect("guesser", (const uint8_t *)info, info_len);
    CHECK(rc != ORBITTE_OK, "a peer with another token is kept out");
    *digit = saved;

    /* No token: the field renamed, so the reader sees none. */
    token[5] = 'x';
    rc = try_connect("stranger", (const uint8_t *)info, info_len);
    CHECK(rc != ORBITTE_OK, "a peer without the token is kept out");

    orbitte_engine_destroy(guarded);
    return summary();
}
