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
 *   fake-gpu      one fake device (default); see below for its memory
 *
 * Asynchronous copies (cuMemcpy*Async) are queued and done later by a
 * worker thread, in order per stream. A stream's copies are held until
 * someone waits for them: cuStreamSynchronize (returns once they are done),
 * cuStreamQuery (starts them; CUDA_ERROR_NOT_READY until done),
 * cuCtxSynchronize, or freeing memory or the stream they touch (which waits,
 * as the real driver's implicit synchronization does). So bytes copied by a
 * stream are visible only after a wait on it, and a missing wait reads
 * stale bytes every time.
 * ORBITTE_STUB_COPY_DELAY_US=N also lets the worker start a held copy N
 * microseconds after it was issued, without a wait (copies then overlap the
 * caller's work, as on a GPU).
 * ORBITTE_STUB_FAIL_SYNC_AFTER=N makes every cuStreamSynchronize after the
 * first N return CUDA_ERROR_ILLEGAL_ADDRESS (700) at once, sticky, as a real
 * fault: the copies it would have waited for still run later. A process
 * that loaded the stub itself (a Python test through ctypes) can turn the
 * same failure on and off with orbitte_stub_fail_syncs(1 / 0), which is not
 * a driver function.
 *
 * Device memory is not host memory, as on a GPU: cuMemAlloc hands out an
 * address range reserved without access (PROT_NONE, so /proc/self/maps shows
 * it mapped but neither readable nor writable, and dereferencing it faults),
 * and the bytes live in a separate host block the driver functions reach by
 * translating the address. Pinned host memory (cuMemHostAlloc) is ordinary
 * readable and writable host memory.
 * Compiling with -DOMIT_HTOD leaves out cuMemcpyHtoDAsync_v2 (a driver that
 * lacks a symbol).
 *
 * Only status codes that exist in the CUresult enum are returned: the Rust
 * side reads them as that enum.
 */
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
#define NOT_READY 600
#define ILLEGAL_ADDRESS 700

#define TOTAL_MEMORY ((size_t)256 << 20)
#define MAX_ALLOCS 1024

enum kind { FREE_SLOT = 0, HOST = 1, DEVICE = 2 };

static struct alloc {
    /* The address handed out. */
    uintptr_t base;
    size_t size;
    int kind;
    /* Where the bytes are: `base` itself for host memory, a separate host
     * block for device memory (whose `base` is reserved without access). */
    uintptr_t bytes;
} allocs[MAX_ALLOCS];
static size_t device_used;
static long syncs;
/* Set by orbitte_stub_fail_syncs: every cuStreamSynchronize fails. */
static int fail_syncs;
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

static int record(uintptr_t base, void *bytes, size_t size, int kind) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].kind == FREE_SLOT) {
            allocs[i].base = base;
            allocs[i].size = size;
            allocs[i].kind = kind;
            allocs[i].bytes = (uintptr_t)bytes;
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

/* The host address of the bytes of device address `d` (inside one device
 * allocation, checked by the caller). */
static void *device_bytes(CUdeviceptr d) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)d);
    uintptr_t at = a ? a->bytes + ((uintptr_t)d - a->base) : 0;
    pthread_mutex_unlock(&lock);
    return (void *)at;
}

static void drain_range(uintptr_t base, size_t size);

static CUresult release(uintptr_t p, int kind) {
    pthread_mutex_lock(&lock);
    struct alloc *found = find(p);
    size_t size = found ? found->size : 0;
    uintptr_t bytes = found ? found->bytes : 0;
    pthread_mutex_unlock(&lock);
    /* Freeing memory waits for the copies that use it (queued copies name
     * the bytes, not the device address). */
    if (size) drain_range(bytes, size);
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    if (!a || a->base != p || a->kind != kind) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    if (kind == DEVICE) device_used -= a->size;
    a->kind = FREE_SLOT;
    size = a->size;
    bytes = a->bytes;
    pthread_mutex_unlock(&lock);
    if (kind == DEVICE) munmap((void *)p, size);
    free((void *)bytes);
    return OK;
}

/* ---- streams and the copy worker --------------------------------------- */

struct stream {
    /* Copies issued, allowed to start, and done; each copy has the number
     * `enqueued` had after it was issued. */
    unsigned long long enqueued, released, done;
};

struct op {
    struct op *next;
    struct stream *s;
    unsigned long long seq;
    void *dst;
    const void *src;
    size_t n;
    struct timespec issued;
};

/* The queue, oldest first, and everything above, under qlock; qcond is
 * broadcast on every issue, release and completion. */
static pthread_mutex_t qlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static struct op *qhead, *qtail;
/* The copy the worker is doing now (out of the queue), if any. */
static struct op *running;
static pthread_once_t worker_once = PTHREAD_ONCE_INIT;

static long copy_delay_us(void) {
    const char *v = getenv("ORBITTE_STUB_COPY_DELAY_US");
    return v ? atol(v) : -1;
}

static long elapsed_us(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000000L + (now.tv_nsec - since->tv_nsec) / 1000L;
}

/* The oldest copy allowed to start (the oldest of its stream, since a
 * stream's copies are queued in order and released as a prefix), unlinked. */
static struct op *take_startable(long delay) {
    struct op *prev = NULL;
    for (struct op *o = qhead; o; prev = o, o = o->next) {
        if (delay >= 0 && o->seq > o->s->released && elapsed_us(&o->issued) >= delay)
            o->s->released = o->seq;
        if (o->seq <= o->s->released) {
            if (prev) prev->next = o->next; else qhead = o->next;
            if (qtail == o) qtail = prev;
            return o;
        }
    }
    return NULL;
}

static void *copy_worker(void *arg) {
    (void)arg;
    long delay = copy_delay_us();
    pthread_mutex_lock(&qlock);
    for (;;) {
        struct op *o = take_startable(delay);
        if (!o) {
            if (delay >= 0 && qhead) {
                struct timespec t;
                clock_gettime(CLOCK_REALTIME, &t);
                t.tv_nsec += (delay > 0 ? delay : 1) * 1000L;
                t.tv_sec += t.tv_nsec / 1000000000L;
                t.tv_nsec %= 1000000000L;
                pthread_cond_timedwait(&qcond, &qlock, &t);
            } else {
                pthread_cond_wait(&qcond, &qlock);
            }
            continue;
        }
        running = o;
        pthread_mutex_unlock(&qlock);
        memcpy(o->dst, o->src, o->n);
        pthread_mutex_lock(&qlock);
        running = NULL;
        o->s->done = o->seq;
        free(o);
        pthread_cond_broadcast(&qcond);
    }
    return NULL;
}

static void start_worker(void) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &attr, copy_worker, NULL);
    pthread_attr_destroy(&attr);
}

static CUresult enqueue_copy(void *dst, const void *src, size_t n, CUstream st) {
    struct stream *s = st;
    if (!s) return INVALID_VALUE; /* the legacy default stream is not used */
    struct op *o = malloc(sizeof *o);
    if (!o) return OUT_OF_MEMORY;
    pthread_once(&worker_once, start_worker);
    o->next = NULL;
    o->dst = dst;
    o->src = src;
    o->n = n;
    o->s = s;
    clock_gettime(CLOCK_MONOTONIC, &o->issued);
    pthread_mutex_lock(&qlock);
    o->seq = ++s->enqueued;
    if (qtail) qtail->next = o; else qhead = o;
    qtail = o;
    pthread_cond_broadcast(&qcond);
    pthread_mutex_unlock(&qlock);
    return OK;
}

/* Lets every copy issued so far on `s` start and waits until they are done.
 * Call with qlock held. */
static void drain_stream_locked(struct stream *s) {
    unsigned long long upto = s->enqueued;
    if (s->released < upto) s->released = upto;
    pthread_cond_broadcast(&qcond);
    while (s->done < upto) pthread_cond_wait(&qcond, &qlock);
}

static int touches(const struct op *o, uintptr_t base, size_t size) {
    uintptr_t d = (uintptr_t)o->dst, s = (uintptr_t)o->src;
    return (d < base + size && base < d + o->n) || (s < base + size && base < s + o->n);
}

/* Waits for every queued or running copy that touches [base, base + size). */
static void drain_range(uintptr_t base, size_t size) {
    pthread_mutex_lock(&qlock);
    for (;;) {
        struct op *hit = NULL;
        for (struct op *o = qhead; o && !hit; o = o->next)
            if (touches(o, base, size)) hit = o;
        if (hit) {
            drain_stream_locked(hit->s);
        } else if (running && touches(running, base, size)) {
            pthread_cond_wait(&qcond, &qlock);
        } else {
            break;
        }
    }
    pthread_mutex_unlock(&qlock);
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

CUresult cuCtxSynchronize(void) {
    pthread_mutex_lock(&qlock);
    while (qhead) drain_stream_locked(qhead->s);
    while (running) pthread_cond_wait(&qcond, &qlock);
    pthread_mutex_unlock(&qlock);
    return OK;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    *s = calloc(1, sizeof(struct stream));
    return *s ? OK : OUT_OF_MEMORY;
}

CUresult cuStreamDestroy_v2(CUstream st) {
    if (!st) return INVALID_VALUE;
    /* The real driver lets issued work finish after the call; the stub waits
     * for it so the worker never touches a freed stream. */
    pthread_mutex_lock(&qlock);
    drain_stream_locked(st);
    pthread_mutex_unlock(&qlock);
    free(st);
    return OK;
}

CUresult cuStreamSynchronize(CUstream st) {
    if (!st) return INVALID_VALUE;
    const char *after = getenv("ORBITTE_STUB_FAIL_SYNC_AFTER");
    pthread_mutex_lock(&lock);
    long n = ++syncs;
    pthread_mutex_unlock(&lock);
    struct stream *s = st;
    pthread_mutex_lock(&qlock);
    if ((after && n > atol(after)) || __atomic_load_n(&fail_syncs, __ATOMIC_SEQ_CST)) {
        /* A fault: nothing is known about the copies, which still run. */
        s->released = s->enqueued;
        pthread_cond_broadcast(&qcond);
        pthread_mutex_unlock(&qlock);
        return ILLEGAL_ADDRESS;
    }
    drain_stream_locked(s);
    pthread_mutex_unlock(&qlock);
    return OK;
}

CUresult cuStreamQuery(CUstream st) {
    if (!st) return INVALID_VALUE;
    struct stream *s = st;
    pthread_mutex_lock(&qlock);
    if (s->released < s->enqueued) {
        s->released = s->enqueued;
        pthread_cond_broadcast(&qcond);
    }
    int idle = s->done == s->enqueued;
    pthread_mutex_unlock(&qlock);
    return idle ? OK : NOT_READY;
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
    void *at = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!m || at == MAP_FAILED || !record((uintptr_t)at, m, n, DEVICE)) {
        pthread_mutex_unlock(&lock);
        free(m);
        if (at != MAP_FAILED) munmap(at, n);
        return OUT_OF_MEMORY;
    }
    device_used += n;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)at;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) { return release((uintptr_t)p, DEVICE); }

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
    (void)flags;
    void *m = malloc(n);
    pthread_mutex_lock(&lock);
    int ok = m && record((uintptr_t)m, m, n, HOST);
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
    if (!device_range_ok(src, n)) return INVALID_VALUE;
    return enqueue_copy(dst, device_bytes(src), n, s);
}

#ifndef OMIT_HTOD
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    if (!device_range_ok(dst, n)) return INVALID_VALUE;
    return enqueue_copy(device_bytes(dst), src, n, s);
}
#endif

CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    if (!device_range_ok(d, n)) return INVALID_VALUE;
    memset(device_bytes(d), v, n);
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

/* Test control, not a driver function: while `on`, every
 * cuStreamSynchronize fails as with ORBITTE_STUB_FAIL_SYNC_AFTER. */
void orbitte_stub_fail_syncs(int on) { __atomic_store_n(&fail_syncs, on, __ATOMIC_SEQ_CST); }
