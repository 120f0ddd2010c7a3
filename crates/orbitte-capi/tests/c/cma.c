/* Same-host copies: two engines created with ORBITTE_ENGINE_CMA in one
 * process (one host, one uid) copy caller memory with process_vm_writev
 * and process_vm_readv. A small WRITE (copied by the post) and a large one
 * (in pieces) with notifications that arrive after their bytes, a READ in
 * scattered descriptors, the metrics counting the copies and the engine's
 * paths moving none of the caller's bytes, WRITEs larger than a post
 * copies (the checks copy pieces too) landing each byte once and before
 * their notification, one released in flight, a descriptor outside the
 * peer's memory refused, and an engine without the flag served by its
 * paths. Exits 0 when every check held. */

#include <stdint.h>

#include "orbitte.h"
#include "check.h"

#define BIG (16u << 20)
#define SMALL (64u << 10)
#define BLOCK 4096u
#define BLOCKS 512u
#define HUGE (96u << 20)
#define SEG (64u << 10)
#define ROUNDS 8u

/* The value of the metric line starting with `prefix` (-1: none). */
static long long metric(orbitte_engine *e, const char *prefix) {
    static char text[1 << 16];
    size_t len = 0;
    if (orbitte_metrics(e, (uint8_t *)text, sizeof text - 1, &len) != ORBITTE_OK) return -1;
    text[len] = '\0';
    long long total = -1;
    for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            const char *space = strchr(line, ' ');
            total = (total < 0 ? 0 : total) + (space ? atoll(space + 1) : 0);
        }
    }
    return total;
}

static uint8_t pattern(size_t i, unsigned seed) { return (uint8_t)((i * 2654435761u + seed) % 251); }

/* Connects `from` to `to` and loads the public data of `reg` of `to`. */
static orbitte_peer connect_and_load(orbitte_engine *from, orbitte_engine *to, orbitte_reg reg) {
    uint8_t info[1024], data[64];
    size_t info_len = 0, data_len = 0;
    MUST(orbitte_conn_info(to, info, sizeof info, &info_len));
    orbitte_peer p = 0;
    MUST(orbitte_connect(from, info, info_len, &p));
    MUST(orbitte_public_data(to, reg, data, sizeof data, &data_len));
    MUST(orbitte_load_remote(from, p, data, data_len));
    return p;
}

/* Whether `peer` of `e` is served by same-host copies; prints why. */
static int uses_cma(orbitte_engine *e, orbitte_peer peer, const char *label) {
    char why[512];
    size_t len = 0;
    uint8_t used = 0;
    MUST(orbitte_peer_cma(e, peer, &used, (uint8_t *)why, sizeof why - 1, &len));
    why[len] = '\0';
    printf("%s: %s\n", label, why);
    return used;
}

int main(void) {
    orbitte_engine *target = NULL, *initiator = NULL;
    uint32_t flags = ORBITTE_ENGINE_TOKEN | ORBITTE_ENGINE_CMA;
    MUST(orbitte_engine_create("cma-target", "127.0.0.1:0", NULL, flags, &target));
    MUST(orbitte_engine_create("cma-initiator", "127.0.0.1:0", NULL, flags, &initiator));

    uint8_t *dst = aligned_alloc(4096, BIG);
    uint8_t *src = aligned_alloc(4096, BIG);
    if (dst == NULL || src == NULL) return 1;
    memset(dst, 0, BIG);
    for (size_t i = 0; i < BIG; i++) src[i] = pattern(i, 1);
    orbitte_reg dst_reg = 0, src_reg = 0;
    MUST(orbitte_register(target, dst, BIG, ORBITTE_REG_REMOTE, &dst_reg));
    MUST(orbitte_register(initiator, src, BIG, 0, &src_reg));
    orbitte_peer peer = connect_and_load(initiator, target, dst_reg);
    CHECK(uses_cma(initiator, peer, "same host"), "a same-host peer is served by the kernel's copies");

    /* A small WRITE with a notification: copied by the post itself. */
    orbitte_desc small = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, SMALL};
    orbitte_xfer x = 0;
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, &small, 1, &x));
    orbitte_xfer_status st;
    CHECK(run(initiator, x, "small", &st) == ORBITTE_OK, "small WRITE");
    char name[64];
    static uint8_t msg[ORBITTE_MAX_NOTIF_LEN];
    long n = wait_notif(target, name, sizeof name, msg);
    CHECK(n == 5 && memcmp(msg, "small", 5) == 0, "the small WRITE's notification: %ld", n);
    CHECK(memcmp(dst, src, SMALL) == 0, "the small WRITE's bytes");
    MUST(orbitte_xfer_release(initiator, x));

    /* 16 MiB: copied in pieces, by the post and a copy thread. */
    orbitte_desc big = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, BIG};
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, &big, 1, &x));
    int32_t posted = orbitte_xfer_post(initiator, x, (const uint8_t *)"big", 3);
    CHECK(posted == ORBITTE_IN_PROGRESS || posted == ORBITTE_OK, "big WRITE posted: %d", posted);
    n = wait_notif(target, name, sizeof name, msg);
    /* The notification is seen after every byte. */
    CHECK(n == 3 && memcmp(msg, "big", 3) == 0, "the big WRITE's notification: %ld", n);
    CHECK(memcmp(dst, src, BIG) == 0, "the big WRITE's bytes, when its notification arrived");
    CHECK(run(initiator, x, NULL, &st) == ORBITTE_OK, "the big WRITE again, without notification");
    MUST(orbitte_xfer_release(initiator, x));

    /* READ in scattered descriptors, remote blocks in reverse order. */
    for (size_t i = 0; i < BIG; i++) dst[i] = pattern(i, 7);
    memset(src, 0, BIG);
    static orbitte_desc scattered[BLOCKS];
    for (size_t i = 0; i < BLOCKS; i++) {
        scattered[i].local_addr = (uint64_t)(uintptr_t)(src + i * BLOCK);
        scattered[i].remote_addr = (uint64_t)(uintptr_t)(dst + (BLOCKS - 1 - i) * 2 * BLOCK);
        scattered[i].len = BLOCK;
    }
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_READ, scattered, BLOCKS, &x));
    CHECK(run(initiator, x, NULL, &st) == ORBITTE_OK, "scattered READ");
    int same = 1;
    for (size_t i = 0; i < BLOCKS; i++) {
        same &= memcmp(src + i * BLOCK, dst + (BLOCKS - 1 - i) * 2 * BLOCK, BLOCK) == 0;
    }
    CHECK(same, "the scattered READ's bytes");
    MUST(orbitte_xfer_release(initiator, x));

    long long copied_w = metric(initiator, "orbitte_capi_cma_bytes_total{op=\"write\"}");
    long long copied_r = metric(initiator, "orbitte_capi_cma_bytes_total{op=\"read\"}");
    long long engine = metric(initiator, "orbitte_transfer_bytes_total{");
    printf("metrics: copied %lld written, %lld read; the engine's paths %lld\n", copied_w,
           copied_r, engine);
    CHECK(copied_w == (long long)(SMALL + 2 * BIG), "bytes written by the kernel: %lld", copied_w);
    CHECK(copied_r == (long long)(BLOCKS * BLOCK), "bytes read by the kernel: %lld", copied_r);
    /* The pid proof (32 bytes) and the notifications' carriers (1 each). */
    CHECK(engine >= 0 && engine <= 64, "the engine's paths moved %lld bytes", engine);

    /* WRITEs larger than the post copies, of scattered descriptors,
     * checked in a loop so that the checking call copies pieces too: every
     * byte lands once, and each notification arrives after the last. */
    uint8_t *hsrc = aligned_alloc(4096, HUGE);
    uint8_t *hdst = aligned_alloc(4096, HUGE);
    if (hsrc == NULL || hdst == NULL) return 1;
    orbitte_reg hdst_reg = 0, hsrc_reg = 0;
    MUST(orbitte_register(target, hdst, HUGE, ORBITTE_REG_REMOTE, &hdst_reg));
    MUST(orbitte_register(initiator, hsrc, HUGE, 0, &hsrc_reg));
    uint8_t hdata[64];
    size_t hdata_len = 0;
    MUST(orbitte_public_data(target, hdst_reg, hdata, sizeof hdata, &hdata_len));
    MUST(orbitte_load_remote(initiator, peer, hdata, hdata_len));
    static orbitte_desc reversed[HUGE / SEG];
    for (size_t i = 0; i < HUGE / SEG; i++) {
        reversed[i].local_addr = (uint64_t)(uintptr_t)(hsrc + i * SEG);
        reversed[i].remote_addr = (uint64_t)(uintptr_t)(hdst + (HUGE / SEG - 1 - i) * SEG);
        reversed[i].len = SEG;
    }
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, reversed, HUGE / SEG, &x));
    for (unsigned round = 0; round < ROUNDS; round++) {
        for (size_t i = 0; i < HUGE; i++) hsrc[i] = pattern(i, 100 + round);
        memset(hdst, 0, HUGE);
        char tag[32];
        snprintf(tag, sizeof tag, "round %u", round);
        int32_t rc = orbitte_xfer_post(initiator, x, (const uint8_t *)tag, strlen(tag));
        int arrived = 0, intact = 1;
        double end = now_s() + 10.0;
        while (now_s() < end) {
            if (rc == ORBITTE_IN_PROGRESS) rc = orbitte_xfer_check(initiator, x, &st);
            size_t name_len = 0, msg_len = 0;
            int32_t got = orbitte_notif_poll(target, (uint8_t *)name, sizeof name, &name_len, msg,
                                             ORBITTE_MAX_NOTIF_LEN, &msg_len);
            if (got == ORBITTE_OK) {
                arrived = msg_len == strlen(tag) && memcmp(msg, tag, msg_len) == 0;
                /* From the last descriptor, the one copied last. */
                for (size_t i = HUGE / SEG; i-- > 0;) {
                    intact &= memcmp(hdst + (HUGE / SEG - 1 - i) * SEG, hsrc + i * SEG, SEG) == 0;
                }
                break;
            }
        }
        while (rc == ORBITTE_IN_PROGRESS && now_s() < end) rc = orbitte_xfer_check(initiator, x, &st);
        CHECK(rc == ORBITTE_OK, "checked WRITE %u: %d", round, rc);
        CHECK(arrived, "checked WRITE %u: its notification", round);
        CHECK(intact, "checked WRITE %u: every byte, when its notification arrived", round);
    }
    MUST(orbitte_xfer_release(initiator, x));
    long long checked_w = metric(initiator, "orbitte_capi_cma_bytes_total{op=\"write\"}");
    CHECK(checked_w - copied_w == (long long)ROUNDS * HUGE, "checked WRITEs copied %lld bytes",
          checked_w - copied_w);
    copied_w = checked_w;

    /* Released in flight: the pieces no one took are not copied, and the
     * engine goes on. */
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, reversed, HUGE / SEG, &x));
    int32_t posted_huge = orbitte_xfer_post(initiator, x, NULL, 0);
    CHECK(posted_huge == ORBITTE_IN_PROGRESS || posted_huge == ORBITTE_OK, "huge WRITE posted: %d",
          posted_huge);
    MUST(orbitte_xfer_release(initiator, x));
    long long released_w = metric(initiator, "orbitte_capi_cma_bytes_total{op=\"write\"}");
    printf("released in flight: %lld of %u bytes copied\n", released_w - copied_w, HUGE);
    CHECK(released_w - copied_w <= (long long)HUGE, "released WRITE copied %lld bytes",
          released_w - copied_w);
    copied_w = released_w;

    /* Outside the peer's registered memory: refused at prepare. */
    orbitte_desc outside = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst + BIG - 8, 16};
    int32_t rc = orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, &outside, 1, &x);
    printf("outside: %d\n", rc);
    CHECK(rc == ORBITTE_ERR_NOT_FOUND, "a descriptor outside the peer's memory: %d", rc);

    /* Memory unloaded after a transfer was prepared over it: the
     * transfer takes the engine's paths. */
    MUST(orbitte_xfer_prepare(initiator, peer, ORBITTE_OP_WRITE, &small, 1, &x));
    uint8_t data[64];
    size_t data_len = 0;
    MUST(orbitte_public_data(target, dst_reg, data, sizeof data, &data_len));
    MUST(orbitte_unload_remote(initiator, peer, data, data_len));
    memset(dst, 0, SMALL);
    CHECK(run(initiator, x, NULL, &st) == ORBITTE_OK, "WRITE after the unload");
    CHECK(memcmp(dst, src, SMALL) == 0, "the bytes of the WRITE after the unload");
    long long after_w = metric(initiator, "orbitte_capi_cma_bytes_total{op=\"write\"}");
    long long after_engine = metric(initiator, "orbitte_transfer_bytes_total{");
    printf("unloaded: copied %lld written; the engine's paths %lld\n", after_w, after_engine);
    CHECK(after_w == copied_w, "no same-host copy of unloaded memory");
    CHECK(after_engine >= engine + (long long)SMALL, "the engine's paths moved the WRITE");
    MUST(orbitte_xfer_release(initiator, x));

    /* An engine without the flag: the engine's paths. */
    orbitte_engine *plain = NULL;
    MUST(orbitte_engine_create("cma-plain", "127.0.0.1:0", NULL, ORBITTE_ENGINE_TOKEN, &plain));
    orbitte_reg plain_reg = 0;
    MUST(orbitte_register(plain, src, BIG, 0, &plain_reg));
    orbitte_peer p2 = connect_and_load(plain, target, dst_reg);
    CHECK(!uses_cma(plain, p2, "without the flag"), "an engine without the flag takes its paths");
    memset(dst, 0, SMALL);
    MUST(orbitte_xfer_prepare(plain, p2, ORBITTE_OP_WRITE, &small, 1, &x));
    CHECK(run(plain, x, NULL, &st) == ORBITTE_OK, "WRITE without the flag");
    CHECK(memcmp(dst, src, SMALL) == 0, "the bytes of the WRITE without the flag");
    CHECK(metric(plain, "orbitte_capi_cma_bytes_total{op=\"write\"}") == 0,
          "no same-host copy without the flag");
    MUST(orbitte_xfer_release(plain, x));

    orbitte_engine_destroy(plain);
    orbitte_engine_destroy(initiator);
    orbitte_engine_destroy(target);
    free(src);
    free(dst);
    free(hsrc);
    free(hdst);
    return summary();
}
