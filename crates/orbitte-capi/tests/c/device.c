/* CUDA device memory: orbitte_cuda_devices says whether there is any, and
 * orbitte_register_device refuses an address that is not device memory.
 * Exits 0 when every check held. */

#include <stdio.h>
#include <stdlib.h>

#include "orbitte.h"
#include "check.h"

int main(void) {
    size_t count = 0;
    int32_t rc = orbitte_cuda_devices(&count);
    CHECK((rc == ORBITTE_OK && count > 0) ||
              (rc == ORBITTE_ERR_NOT_SUPPORTED && orbitte_last_error() != NULL),
          "orbitte_cuda_devices: %d, %zu devices", rc, count);
    printf("cuda devices: %d: %zu\n", rc, count);

    orbitte_engine *e = NULL;
    if (orbitte_engine_create("device", NULL, NULL, 0, &e) != ORBITTE_OK) {
        fprintf(stderr, "FAIL: create: %s\n", orbitte_last_error());
        return 1;
    }
    char *host = malloc(4096);
    orbitte_reg reg = 0;
    int32_t want = rc == ORBITTE_OK ? ORBITTE_ERR_INVALID_PARAM : ORBITTE_ERR_NOT_SUPPORTED;
    rc = orbitte_register_device(e, (uint64_t)(uintptr_t)host, 4096, ORBITTE_REG_REMOTE, &reg);
    CHECK(rc == want, "host memory registered as device memory: %d, want %d", rc, want);
    printf("host memory as device memory: %d: %s\n", rc, orbitte_last_error());
    free(host);
    orbitte_engine_destroy(e);
    return summary();
}
