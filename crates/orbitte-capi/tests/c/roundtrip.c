/* Two engines in one process, driven through orbitte.h alone: a WRITE
 * with a notification and a READ, bytes checked on the receiving side, a
 * notification sent alone, and bad calls answered with a code and a
 * message. Prints one line per step; exits 0 when every check held. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orbitte.h"
#include "check.h"

int main(void) {
    const size_t len = 1 << 20;
    orbitte_engine *target = NULL, *initiator = NULL;
    MUST(orbitte_engine_create("capi-target", "127.0.0.1:0", NULL, 0, &target));
    MUST(orbitte_engine_create("capi-initiator", "127.0.0.1:0", NULL, 0, &initiator));

    /* The target publishes memory of its own (caller memory) and the
     * initiator moves engine-allocated memory. */
    uint8_t *dst = aligned_alloc(4096, len);
    memset(dst, 0, len);
    orbitte_reg dst_reg = 0;
    MUST(orbitte_register(target, dst, len, ORBITTE_REG_REMOTE, &dst_reg));
    void *src_mem = NULL;
    orbitte_reg src_reg = 0;
    MUST(orbitte_alloc(initiator, 2 * len, 0, &src_mem, &src_reg));
    uint8_t *src = src_mem;
    for (size_t i = 0; i < len; i++) src[i] = (uint8_t)(i * 7 + 3);

    /* Connection info and public data go from target to initiator. */
    size_t info_len = 0;
    CHECK(orbitte_conn_info(target, NULL, 0, &info_len) == ORBITTE_ERR_BUFFER_TOO_SMALL,
          "conn_info with no buffer says how long it is");
    uint8_t *info = malloc(info_len);
    MUST(orbitte_conn_info(target, info, info_len, &info_len));
    orbitte_peer peer = 0;
    MUST(orbitte_connect(initiator, info, info_len, &peer));
    uint8_t public_data[64];
    size_t public_len = 0;
    MUST(orbitte_public_data(target, dst_reg, public_data, sizeof public_data, &public_len));
    MUST(orbitte_load_remote(initiator, peer, public_data, public_len));
    printf("connected: %zu bytes of connection info, %zu of public data\n", info_len,
           public_len);

    /* WRITE in two descriptors (adjacent on both sides: one request), with
     * a notification. */
    orbitte_desc w[2] = {
        {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, len / 2},
        {(uint64_t)(uintptr_t)src + len / 2, (uint64_t)(uintptr_t)dst + len / 2, len / 2},
    };
    orbitte_xfer wx = 0;
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, w, 2, &wx));
    orbitte_xfer_status st;
    memset(&st, 0, sizeof st);
    int32_t rc = run(initiator, wx, "kv-ready:42", &st);
    CHECK(rc == ORBITTE_OK, "WRITE ended with %d", rc);
    CHECK(st.state == ORBITTE_OK && st.requests == 1 && st.outcomes == 1 &&
              st.bytes == len && st.completed_bytes == len && st.failed_desc == UINT64_MAX &&
              st.notification == ORBITTE_NOTIF_SENT,
          "WRITE status: state %d, %llu requests, %llu outcomes, %llu of %llu bytes, "
          "notification %d",
          st.state, (unsigned long long)st.requests, (unsigned long long)st.outcomes,
          (unsigned long long)st.completed_bytes, (unsigned long long)st.bytes,
          st.notification);
    char name[256];
    uint8_t msg[ORBITTE_MAX_NOTIF_LEN];
    long n = wait_notif(target, name, sizeof name, msg);
    CHECK(n == 11 && memcmp(msg, "kv-ready:42", 11) == 0 && strcmp(name, "capi-initiator") == 0,
          "the WRITE's notification arrived from capi-initiator (%ld bytes from %s)", n, name);
    CHECK(memcmp(dst, src, len) == 0, "the target holds the written bytes");
    printf("write: %zu bytes and notification from %s checked\n", len, name);

    /* READ them back into the second half of the allocation. */
    for (size_t i = 0; i < len; i++) dst[i] = (uint8_t)(i * 13 + 1);
    orbitte_desc r = {(uint64_t)(uintptr_t)src + len, (uint64_t)(uintptr_t)dst, len};
    orbitte_xfer rx = 0;
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_READ, &r, 1, &rx));
    rc = run(initiator, rx, NULL, &st);
    CHECK(rc == ORBITTE_OK && st.notification == ORBITTE_NOTIF_NONE, "READ ended with %d", rc);
    CHECK(memcmp(src + len, dst, len) == 0, "the initiator holds the read bytes");
    printf("read: %zu bytes checked\n", len);

    /* A notification alone. */
    MUST(orbitte_notify(initiator, peer, (const uint8_t *)"ping", 4));
    n = wait_notif(target, name, sizeof name, msg);
    CHECK(n == 4 && memcmp(msg, "ping", 4) == 0, "the notification alone arrived (%ld)", n);
    printf("notify: received from %s\n", name);

    /* Memory the target registers after the connection is published to
     * the initiator: its public data loads, and a WRITE reaches it. */
    void *late_mem = NULL;
    orbitte_reg late_reg = 0;
    MUST(orbitte_alloc(target, 4096, ORBITTE_REG_REMOTE, &late_mem, &late_reg));
    MUST(orbitte_public_data(target, late_reg, public_data, sizeof public_data, &public_len));
    MUST(orbitte_load_remote(initiator, peer, public_data, public_len));
    orbitte_desc late = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)late_mem, 4096};
    orbitte_xfer lx = 0;
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, &late, 1, &lx));
    rc = run(initiator, lx, NULL, &st);
    CHECK(rc == ORBITTE_OK && memcmp(late_mem, src, 4096) == 0,
          "a WRITE into memory registered after the connection: %d", rc);
    MUST(orbitte_xfer_release(initiator, lx));
    printf("late registration: written\n");

    /* A peer that goes away: a transfer to it ends in an error, no hang. */
    orbitte_engine *gone = NULL;
    MUST(orbitte_engine_create("capi-gone", "127.0.0.1:0", NULL, 0, &gone));
    void *gone_mem = NULL;
    orbitte_reg gone_reg = 0;
    MUST(orbitte_alloc(gone, 4096, ORBITTE_REG_REMOTE, &gone_mem, &gone_reg));
    uint8_t gone_info[1024];
    size_t gone_len = 0;
    MUST(orbitte_conn_info(gone, gone_info, sizeof gone_info, &gone_len));
    orbitte_peer gone_peer = 0;
    MUST(orbitte_connect(initiator, gone_info, gone_len, &gone_peer));
    orbitte_desc g = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)gone_mem, 4096};
    orbitte_xfer gx = 0;
    MUST(orbitte_xfer_prepare(initiator, gone_peer, ORBITTE_OP_WRITE, &g, 1, &gx));
    MUST(orbitte_engine_destroy(gone));
    double t0 = now_s();
    rc = run(initiator, gx, "never", &st);
    CHECK(rc == ORBITTE_ERR_REMOTE_DISCONNECT && st.state == rc &&
              st.notification != ORBITTE_NOTIF_SENT && st.failed_desc == 0,
          "a WRITE to an engine that is gone: %d, notification %d", rc, st.notification);
    printf("peer gone: %d after %.2f s: %s\n", rc, now_s() - t0, orbitte_last_error());
    MUST(orbitte_xfer_release(initiator, gx));

    /* A disconnected peer: its prepared transfers are refused at post. */
    MUST(orbitte_disconnect(initiator, gone_peer));
    CHECK(orbitte_notify(initiator, gone_peer, (const uint8_t *)"x", 1) == ORBITTE_ERR_BAD_HANDLE,
          "a disconnected peer's handle is refused");

    /* Bad calls: each a code and a message naming the fault. */
    orbitte_reg none = 0;
    rc = orbitte_register(NULL, dst, len, 0, &none);
    const char *why = orbitte_last_error();
    CHECK(rc == ORBITTE_ERR_INVALID_PARAM && why && strstr(why, "engine"),
          "a null engine: %d", rc);
    orbitte_desc bad = {0x10, (uint64_t)(uintptr_t)dst, 64};
    orbitte_xfer bx = 0;
    rc = orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, &bad, 1, &bx);
    why = orbitte_last_error();
    CHECK(rc == ORBITTE_ERR_NOT_FOUND && why && strstr(why, "not inside memory"),
          "an unregistered local address: %d", rc);
    printf("bad call: %d: %s\n", rc, why ? why : "(none)");
    rc = orbitte_xfer_check(initiator, 12345, NULL);
    CHECK(rc == ORBITTE_ERR_BAD_HANDLE, "an unknown transfer: %d", rc);
    rc = orbitte_xfer_post(initiator, wx, NULL, ORBITTE_MAX_NOTIF_LEN + 1);
    CHECK(rc == ORBITTE_ERR_INVALID_PARAM, "a null notification of a nonzero length: %d", rc);
    rc = orbitte_conn_info(target, NULL, 0, NULL);
    CHECK(rc == ORBITTE_ERR_INVALID_PARAM, "a null length pointer: %d", rc);
    MUST(orbitte_xfer_check(initiator, wx, NULL));
    CHECK(orbitte_last_error() == NULL, "a call that succeeds clears the last error");
    rc = orbitte_deregister(target, dst_reg + 1000);
    CHECK(rc == ORBITTE_ERR_BAD_HANDLE, "an unknown registration: %d", rc);

    /* Teardown: transfers released, memory deregistered, engines gone. */
    MUST(orbitte_xfer_release(initiator, wx));
    MUST(orbitte_xfer_release(initiator, rx));
    CHECK(orbitte_xfer_release(initiator, wx) == ORBITTE_ERR_BAD_HANDLE, "a second release");
    MUST(orbitte_deregister(initiator, src_reg));
    MUST(orbitte_disconnect(initiator, peer));
    MUST(orbitte_engine_destroy(initiator));
    MUST(orbitte_engine_destroy(target));
    CHECK(orbitte_engine_destroy(target) == ORBITTE_ERR_BAD_HANDLE, "a second destroy");
    free(info);
    free(dst);
    return summary();
}
