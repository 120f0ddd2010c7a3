/*
 * A stand-in for libcuda.so.1, compiled during the test by orbitte-cuda's
 * `testing` module (feature `testing`; used by orbitte-cuda's
 * tests/stub_driver.rs and orbitte-engine's tests/staging.rs) and put on
 * LD_LIBRARY_PATH of a child process. It exports exactly the driver
 * functions orbitte-cuda may call (REQUIRED_DRIVER_SYMBOLS), so the error
 * paths and the staging logic run in CI without a GPU.
 *
 * ORBITTE_STUB_MODE selects the behaviour:
 *   no-device     cuInit returns CUDA_ERROR_NO_DEVICE (100)
 *   zero-devices  cuInit succeeds, cuDeviceGetCount reports 0
 *   fake-gpu      one fake device; "device memory" is host memory, copies
 *                 are plain memcpy, streams complete at once (default)
 * ORBITTE_STUB_FAIL_SYNC_AFTER=N makes every cuStreamSynchronize after the
 * first N return CUDA_ERROR_ILLEGAL_ADDRESS (700), sticky, as a real fault.
 * Compiling with -DOMIT_HTOD leaves out cuMemcpyHtoDAsync_v2 (a driver that
 * lacks a symbol).
 *
 * Only status codes that exist in the CUresult enum are returned: the Rust
 * side reads them as that enum.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;

#define OK 0
#define INVALID_VALUE 1
#define OUT_OF_MEMORY 2
#define NO_DEVICE 100
#define INVALID_DEVICE 101
#define INVALID_CONTEXT 201
#define ILLEGAL_ADDRESS 700

#define TOTAL_MEMORY ((size_t)256 << 20)
#define MAX_ALLOCS 1024

enum kind { FREE_SLOT = 0, HOST = 1, DEVICE = 2 };

static struct alloc {
    uintptr_t base;
    size_t size;
    int kind;
} allocs[MAX_ALLOCS];
static size_t device_used;
static long syncs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int context_token;
static __thread CUcontext current;

static int mode_is(const char *m) {
    const char *v = getenv("ORBITTE_STUB_MODE");
    return strcmp(v ? v : "fake-gpu", m) == 0;
}

static void put_string(char *dst, int len, const char *src) {
    if (len <= 0) return;
    strncpy(dst, src, (size_t)len - 1);
    dst[len - 1] = 0;
}

static int record(void *p, size_t size, int kind) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].kind == FREE_SLOT) {
            allocs[i].base = (uintptr_t)p;
            allocs[i].size = size;
            allocs[i].kind = kind;
            return 1;
        }
    }
    return 0;
}

static struct alloc *find(uintptr_t p) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        struct alloc *a = &allocs[i];
        if (a->kind != FREE_SLOT && p >= a->base && p < a->base + a->size) return a;
    }
    return NULL;
}

static CUresult release(uintptr_t p, int kind) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    if (!a || a->base != p || a->kind != kind) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    if (kind == DEVICE) device_used -= a->size;
    a->kind = FREE_SLOT;
    pthread_mutex_unlock(&lock);
    free((void *)p);
    return OK;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return mode_is("no-device") ? NO_DEVICE : OK;
}

CUresult cuDriverGetVersion(int *v) {
    *v = 12080;
    return OK;
}

CUresult cuDeviceGetCount(int *n) {
    *n = mode_is("zero-devices") ? 0 : 1;
    return OK;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0 || !mode_is("fake-gpu")) return INVALID_DEVICE;
    *d = 0;
    return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    put_string(name, len, "OrbitTE stub GPU");
    return OK;
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    (void)d;
    put_string(id, len, "0000:3B:00.0");
    return OK;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    (void)d;
    *bytes = TOTAL_MEMORY;
    return OK;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    (void)d;
    /* 75/76: compute capability major/minor; everything else (memory pools
     * included) reads as 0. */
    *v = attr == 75 ? 9 : 0;
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    (void)d;
    *c = &context_token;
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    (void)d;
    return OK;
}

CUresult cuCtxGetCurrent(CUcontext *c) {
    *c = current;
    return OK;
}

CUresult cuCtxSetCurrent(CUcontext c) {
    current = c;
    return OK;
}

CUresult cuCtxSynchronize(void) { return OK; }

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    *s = malloc(1);
    return *s ? OK : OUT_OF_MEMORY;
}

CUresult cuStreamDestroy_v2(CUstream s) {
    free(s);
    return OK;
}

CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    const char *after = getenv("ORBITTE_STUB_FAIL_SYNC_AFTER");
    pthread_mutex_lock(&lock);
    long n = ++syncs;
    pthread_mutex_unlock(&lock);
    if (after && n > atol(after)) return ILLEGAL_ADDRESS;
    return OK;
}

CUresult cuStreamQuery(CUstream s) {
    (void)s;
    return OK;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&lock);
    *free_bytes = TOTAL_MEMORY - device_used;
    pthread_mutex_unlock(&lock);
    *total = TOTAL_MEMORY;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    pthread_mutex_lock(&lock);
    if (n == 0 || n > TOTAL_MEMORY - device_used) {
        pthread_mutex_unlock(&lock);
        return n == 0 ? INVALID_VALUE : OUT_OF_MEMORY;
    }
    void *m = malloc(n);
    if (!m || !record(m, n, DEVICE)) {
        pthread_mutex_unlock(&lock);
        free(m);
        return OUT_OF_MEMORY;
    }
    device_used += n;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)m;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) { return release((uintptr_t)p, DEVICE); }

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
    (void)flags;
    void *m = malloc(n);
    pthread_mutex_lock(&lock);
    int ok = m && record(m, n, HOST);
    pthread_mutex_unlock(&lock);
    if (!ok) {
        free(m);
        return OUT_OF_MEMORY;
    }
    *p = m;
    return OK;
}

CUresult cuMemFreeHost(void *p) { return release((uintptr_t)p, HOST); }

/* Copies check that the device side is inside one device allocation, as
 * the real driver would fault otherwise. */
static int device_range_ok(CUdeviceptr d, size_t n) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)d);
    int ok = a && a->kind == DEVICE && (uintptr_t)d + n <= a->base + a->size;
    pthread_mutex_unlock(&lock);
    return ok;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    if (!device_range_ok(src, n)) return INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return OK;
}

#ifndef OMIT_HTOD
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    if (!device_range_ok(dst, n)) return INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, n);
    return OK;
}
#endif

CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    if (!device_range_ok(d, n)) return INVALID_VALUE;
    memset((void *)(uintptr_t)d, v, n);
    return OK;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    /* Like a driver that wants a current context for pointer queries. */
    if (!current) return INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p);
    int kind = a ? a->kind : FREE_SLOT;
    pthread_mutex_unlock(&lock);
    if (kind == FREE_SLOT) return INVALID_VALUE;
    switch (attr) {
    case 2: /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
        *(unsigned int *)data = (unsigned int)kind;
        return OK;
    case 8: /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
        *(unsigned char *)data = 0;
        return OK;
    case 9: /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
        *(int *)data = 0;
        return OK;
    default:
        return INVALID_VALUE;
    }
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p);
    if (a) {
        if (base) *base = (CUdeviceptr)a->base;
        if (size) *size = a->size;
    }
    pthread_mutex_unlock(&lock);
    return a ? OK : INVALID_VALUE;
}
