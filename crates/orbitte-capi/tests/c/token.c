/* The listener token: an engine created with ORBITTE_ENGINE_TOKEN puts a
 * token in its connection info and lets in only peers that connect with
 * it. Exits 0 when every check held. */

#include <stdio.h>
#include <string.h>

#include "orbitte.h"
#include "check.h"

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

    int32_t rc = try_connect("holder", NULL, (const uint8_t *)info, info_len);
    CHECK(rc == ORBITTE_OK, "a peer with the connection info is let in: %d", rc);

    /* Another token: one hexadecimal digit changed. */
    char *digit = token + strlen("\"token\":\"");
    char saved = *digit;
    *digit = saved == '0' ? '1' : '0';
    rc = try_connect("guesser", NULL, (const uint8_t *)info, info_len);
    CHECK(rc != ORBITTE_OK, "a peer with another token is kept out");
    *digit = saved;

    /* No token: the field renamed, so the reader sees none. */
    token[5] = 'x';
    rc = try_connect("stranger", NULL, (const uint8_t *)info, info_len);
    CHECK(rc != ORBITTE_OK, "a peer without the token is kept out");

    orbitte_engine_destroy(guarded);
    return summary();
}
