/* OrbitTE's C API (docs/capi.md). Generated from crates/orbitte-capi by
 * `cargo xtask capi-header`: do not edit; `--check` fails when it drifted. */

#ifndef ORBITTE_H
#define ORBITTE_H

#include <stddef.h>
#include <stdint.h>

// `orbitte_engine_create` flag: also register host memory on the RDMA
// NICs found (Host Direct); without it registrations are served by the
// tcp and local paths only.
#define ORBITTE_ENGINE_RDMA 1

// `orbitte_engine_create` flag: listen with a fresh listener token,
// carried in the connection info. Only peers handed the connection
// info connect (with a cluster secret as well, they need both).
#define ORBITTE_ENGINE_TOKEN 2

// `orbitte_engine_create` flag: copy WRITE and READ of host memory with
// same-host peers that set it too, by `process_vm_writev` and
// `process_vm_readv` (one kernel copy between the two processes). The
// engine publishes its pid, uid and host identity in the connection info.
// It takes the kernel's permission (same uid, Yama `ptrace_scope` absent
// or 0), which lets a process of the same uid touch any of this process's
// memory, not only its registrations: leave it out where that is not
// wanted. `orbitte_peer_cma` says whether a peer is served so, or why not.
#define ORBITTE_ENGINE_CMA 4

// Registration flag: publish the memory to peers, who may READ and WRITE
// it; without it the memory is local-only (a source or sink of this
// engine's transfers).
#define ORBITTE_REG_REMOTE 1

// READ: remote bytes into local memory.
#define ORBITTE_OP_READ 0

// WRITE: local bytes into remote memory.
#define ORBITTE_OP_WRITE 1

// The most bytes a notification carries (over rdma-only peers, 4096).
#define ORBITTE_MAX_NOTIF_LEN (1 << 20)

// `orbitte_xfer_status.failed_status`: the request completed.
#define ORBITTE_REQ_COMPLETE 0

// A slice of the request failed.
#define ORBITTE_REQ_FAILED 1

// The request timeout passed first.
#define ORBITTE_REQ_TIMED_OUT 2

// The request was cancelled (the transfer was released in flight).
#define ORBITTE_REQ_CANCELLED 3

// `orbitte_xfer_status.remote_effect`: no remote byte changed.
#define ORBITTE_EFFECT_NONE 0

// Remote bytes past the completed prefix may have changed.
#define ORBITTE_EFFECT_POSSIBLE 1

// Every byte was written.
#define ORBITTE_EFFECT_COMPLETE 2

// `orbitte_xfer_status.notification`: the post carried none.
#define ORBITTE_NOTIF_NONE 0

// Not sent yet: requests are still moving.
#define ORBITTE_NOTIF_PENDING 1

// Handed to the peer's path after every byte arrived.
#define ORBITTE_NOTIF_SENT 2

// Not sent, and it never will be (a request did not complete).
#define ORBITTE_NOTIF_NOT_SENT 3

// The peer refused it (its unread notifications are at a bound): the
// peer's application must read its notifications; the transfer fails.
#define ORBITTE_NOTIF_REFUSED 4

// Sent, but the rail went down before the peer said whether it kept it.
#define ORBITTE_NOTIF_UNCONFIRMED 5

// What every call returns (as an `int32_t`). In C these are enumerators,
// safe in any expression; Rust code uses the `i32` constants of the same
// names.
enum orbitte_status
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    // Success.
    ORBITTE_OK = 0,
    // A transfer is still moving (`orbitte_xfer_post`, `orbitte_xfer_check`).
    ORBITTE_IN_PROGRESS = 1,
    // No notification is waiting (`orbitte_notif_poll`).
    ORBITTE_EMPTY = 2,
    // The transfer was never posted: post it first.
    ORBITTE_ERR_NOT_POSTED = -1,
    // An argument was refused: a null pointer, a zero length, an unknown
    // operation or flag, text that is not UTF-8, a notification too large.
    ORBITTE_ERR_INVALID_PARAM = -2,
    // The engine failed underneath: it could not be built, listen, register,
    // or a request of a transfer did not complete.
    ORBITTE_ERR_BACKEND = -3,
    // An address is in no registration of this engine, or in no range the
    // peer published.
    ORBITTE_ERR_NOT_FOUND = -4,
    // Connection info or public data that is not this API's, or names
    // another engine (or an older incarnation) than the one that answered.
    ORBITTE_ERR_MISMATCH = -5,
    // The call is not allowed in this state (deregistering memory that
    // requests still use, connection info of an engine without a listener).
    ORBITTE_ERR_NOT_ALLOWED = -6,
    // The transfer is still in flight: wait until `orbitte_xfer_check` says
    // it ended before posting it again.
    ORBITTE_ERR_REPOST_ACTIVE = -7,
    // What was asked for is not available here (CUDA device memory on a
    // machine without the CUDA driver or a device).
    ORBITTE_ERR_NOT_SUPPORTED = -9,
    // The peer cannot be reached, went away, restarted, or was disconnected.
    ORBITTE_ERR_REMOTE_DISCONNECT = -10,
    // The handle names no live engine, registration, peer or transfer
    // (destroyed, released, or never made).
    ORBITTE_ERR_BAD_HANDLE = -20,
    // The output buffer is too small (or null): the length needed was
    // written where the call writes lengths.
    ORBITTE_ERR_BUFFER_TOO_SMALL = -21,
    // A bug in this library: it panicked. The panic was caught, the engine
    // may be left in any state; `orbitte_last_error` says where.
    ORBITTE_ERR_PANIC = -22,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum orbitte_status orbitte_status;
#else
typedef int32_t orbitte_status;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

// An engine, as C holds it: an opaque pointer (never dereferenced).
typedef struct orbitte_engine orbitte_engine;

// A peer an engine connected to (0 is never one).
typedef uint64_t orbitte_peer;

// A registration of an engine (0 is never one).
typedef uint64_t orbitte_reg;

// One descriptor of a transfer: `len` bytes at `local_addr` (in memory
// this engine registered) and at `remote_addr` (in memory the peer
// published).
typedef struct orbitte_desc {
    // Address in this process.
    uint64_t local_addr;
    // Address in the peer's process.
    uint64_t remote_addr;
    // Bytes (at least 1).
    uint64_t len;
} orbitte_desc;

// A prepared transfer of an engine (0 is never one).
typedef uint64_t orbitte_xfer;

// What `orbitte_xfer_check` reports of the last post.
typedef struct orbitte_xfer_status {
    // `ORBITTE_OK` (every byte placed and drained, the notification sent
    // if one was attached), `ORBITTE_IN_PROGRESS`, or the failure's code.
    int32_t state;
    // `ORBITTE_NOTIF_*`.
    int32_t notification;
    // Engine requests the transfer is made of (runs of descriptors
    // adjacent on both sides are merged into one).
    uint64_t requests;
    // Requests whose outcome arrived.
    uint64_t outcomes;
    // Bytes of the transfer.
    uint64_t bytes;
    // Bytes known done: the completed prefixes of the outcomes arrived.
    uint64_t completed_bytes;
    // The index of the first descriptor of the first request that did
    // not complete (`UINT64_MAX` when none failed).
    uint64_t failed_desc;
    // That request's completed prefix: its leading bytes known done.
    uint64_t failed_prefix;
    // That request's end (`ORBITTE_REQ_*`).
    int32_t failed_status;
    // For a WRITE, what it may have done remotely (`ORBITTE_EFFECT_*`).
    int32_t remote_effect;
} orbitte_xfer_status;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Creates an engine named `name` (its source id: the name peers see as
// the sender of its notifications).
//
// `listen` is `"host:port"` (port 0: any free port) for an engine peers
// connect to, or NULL for one that only connects out. `secret_file`
// names a file of at least 16 bytes, the cluster secret peers must share;
// NULL reads the file `$ORBITTE_SECRET_FILE` names, if set. `flags`: 0 or
// any of `ORBITTE_ENGINE_RDMA`, `ORBITTE_ENGINE_TOKEN` and
// `ORBITTE_ENGINE_CMA`. On success `*out` is the engine.
//
// # Safety
// `name` and non-null `listen` and `secret_file` are NUL-terminated
// strings; `out` points at writable memory for one pointer.
int32_t orbitte_engine_create(const char *name,
                              const char *listen,
                              const char *secret_file,
                              uint32_t flags,
                              struct orbitte_engine **out);

// Destroys an engine: stops serving, cancels what runs, waits up to 5 s
// for drain, frees what it allocated. Every handle of it is invalid
// afterwards; a second destroy returns `ORBITTE_ERR_BAD_HANDLE`.
//
// # Safety
// None beyond passing a value `orbitte_engine_create` returned (any
// other value is refused, never dereferenced).
int32_t orbitte_engine_destroy(struct orbitte_engine *engine);

// Writes the engine's connection info, the bytes a peer passes to
// `orbitte_connect` (NIXL's `getConnInfo`), into `buf` (capacity
// `cap`) and its length to `*len`. A null or short `buf` gets
// `ORBITTE_ERR_BUFFER_TOO_SMALL` with the length needed in `*len`. An
// engine created without `listen` has none (`ORBITTE_ERR_NOT_ALLOWED`).
//
// # Safety
// `len` points at a writable `size_t`; a non-null `buf` at `cap`
// writable bytes.
int32_t orbitte_conn_info(const struct orbitte_engine *engine,
                          uint8_t *buf,
                          size_t cap,
                          size_t *len);

// Writes what the engine counted since it was created, in the
// Prometheus text format (requests, bytes and outcomes per path, peer
// and operation; notifications; listener refusals; same-host copies:
// `orbitte_capi_cma_*`), into `buf`
// (capacity `cap`) and its length to `*len`. Buffer rules as for
// `orbitte_conn_info`.
//
// # Safety
// `len` points at a writable `size_t`; a non-null `buf` at `cap`
// writable bytes.
int32_t orbitte_metrics(const struct orbitte_engine *engine,
                        uint8_t *buf,
                        size_t cap,
                        size_t *len);

// Connects to the peer whose connection info (`orbitte_conn_info` on
// the peer) is the `len` bytes at `info` (NIXL's `loadRemoteConnInfo`
// and `connect`): a handshake now, which also brings the memory the peer
// published. On success `*out` is the peer.
//
// # Safety
// `info` points at `len` readable bytes; `out` at a writable
// `orbitte_peer`.
int32_t orbitte_connect(const struct orbitte_engine *engine,
                        const uint8_t *info,
                        size_t len,
                        orbitte_peer *out);

// Forgets a peer (NIXL's `disconnect`): transfers prepared for it are
// refused at post with `ORBITTE_ERR_REMOTE_DISCONNECT`, and the handle is
// invalid afterwards. The engine keeps its session to the peer for the
// engine's other users; `orbitte_connect` opens the peer again.
//
// # Safety
// None beyond passing values this API returned.
int32_t orbitte_disconnect(const struct orbitte_engine *engine,
                           orbitte_peer peer);

// Says whether WRITE and READ of host memory with `peer` are copied by
// the kernel between the two processes (`ORBITTE_ENGINE_CMA` on both
// engines, same host and uid, the kernel allowing it): `*used` is 1 or 0,
// and `buf` receives a line saying so (the peer's pid) or why not.
// Buffer rules as for `orbitte_conn_info`.
//
// # Safety
// `used` points at a writable `uint8_t`, `len` at a writable `size_t`; a
// non-null `buf` at `cap` writable bytes.
int32_t orbitte_peer_cma(const struct orbitte_engine *engine,
                         orbitte_peer peer,
                         uint8_t *used,
                         uint8_t *buf,
                         size_t cap,
                         size_t *len);

// Registers `len` bytes of the caller's host memory at `addr` (NIXL's
// `registerMem`); `flags`: 0 (local-only) or `ORBITTE_REG_REMOTE`. The
// range must be mapped readable and writable, and must not overlap a
// registration. On success `*out` is the registration.
//
// The memory stays the caller's: keep it mapped until it is deregistered.
// Every copy the engine makes of it goes through the kernel, so memory
// unmapped while registered fails a transfer, never the process. Memory
// from `orbitte_alloc` is faster, and same-host peers map it directly
// (the local path).
//
// # Safety
// `addr..addr+len` stays mapped and is not freed while registered;
// `out` points at a writable `orbitte_reg`.
int32_t orbitte_register(const struct orbitte_engine *engine,
                         void *addr,
                         size_t len,
                         uint32_t flags,
                         orbitte_reg *out);

// Writes to `*count` how many CUDA devices the driver reports: memory
// of them can be registered with `orbitte_register_device`. Without the
// CUDA driver (libcuda) or a device it returns
// `ORBITTE_ERR_NOT_SUPPORTED`, with the reason in `orbitte_last_error`.
//
// # Safety
// `count` points at a writable `size_t`.
int32_t orbitte_cuda_devices(size_t *count);

// Registers `len` bytes of CUDA device memory at the device address
// `addr` (NIXL's `registerMem` of VRAM), served on the cuda-staging
// path: the engine copies between it and host memory with the CUDA
// driver, never by GPUDirect. `flags` as for `orbitte_register`. The
// driver must say the range lies in one live allocation; without the
// driver or a device the call returns `ORBITTE_ERR_NOT_SUPPORTED`.
//
// # Safety
// The allocation stays live until the memory is deregistered; `out`
// points at a writable `orbitte_reg`.
int32_t orbitte_register_device(const struct orbitte_engine *engine,
                                uint64_t addr,
                                size_t len,
                                uint32_t flags,
                                orbitte_reg *out);

// Allocates `len` bytes of zeroed, page-aligned host memory and registers
// it (`flags` as for `orbitte_register`). `*addr` is its first byte,
// `*out` the registration. The memory is the engine's: same-host peers
// map it (the local path), and it is freed once deregistered (or with
// the engine) and no transfer uses it.
//
// # Safety
// `addr` points at a writable pointer, `out` at a writable `orbitte_reg`.
int32_t orbitte_alloc(const struct orbitte_engine *engine,
                      size_t len,
                      uint32_t flags,
                      void **addr,
                      orbitte_reg *out);

// Deregisters (NIXL's `deregisterMem`). Refused with
// `ORBITTE_ERR_NOT_ALLOWED` while transfers still use the memory: check
// or release them first.
//
// # Safety
// None beyond passing values this API returned.
int32_t orbitte_deregister(const struct orbitte_engine *engine,
                           orbitte_reg reg);

// Writes the public data of a registration (NIXL's `getPublicData`):
// the bytes a peer passes to `orbitte_load_remote` to check it can reach
// the memory. Buffer rules as for `orbitte_conn_info`.
//
// # Safety
// `len` points at a writable `size_t`; a non-null `buf` at `cap`
// writable bytes.
int32_t orbitte_public_data(const struct orbitte_engine *engine,
                            orbitte_reg reg,
                            uint8_t *buf,
                            size_t cap,
                            size_t *len);

// Forgets memory of `peer` that `orbitte_load_remote` loaded (NIXL's
// `unloadMD`): same-host copies no longer reach it, and transfers
// prepared over it take the engine's paths from their next post.
//
// # Safety
// `data` points at `len` readable bytes.
int32_t orbitte_unload_remote(const struct orbitte_engine *engine,
                              orbitte_peer peer,
                              const uint8_t *data,
                              size_t len);

// Checks that `peer` published the memory whose public data
// (`orbitte_public_data` on the peer) is the `len` bytes at `data`
// (NIXL's `loadRemoteMD`): `ORBITTE_OK`, or `ORBITTE_ERR_NOT_FOUND`.
// Memory the peer registered after the connection is found: the session
// is then opened again once, which brings it (and replaces the rails to
// the peer: load what a transfer needs before posting it).
//
// # Safety
// `data` points at `len` readable bytes.
int32_t orbitte_load_remote(const struct orbitte_engine *engine,
                            orbitte_peer peer,
                            const uint8_t *data,
                            size_t len);

// Takes the oldest notification a peer sent this engine: the sender's
// name (its engine's name, NUL-terminated) into `name` (capacity
// `name_cap`, length without the NUL in `*name_len`) and its bytes into
// `msg` (capacity `msg_cap`, length in `*msg_len`). Returns `ORBITTE_OK`,
// or `ORBITTE_EMPTY` when none is waiting. When a buffer is too small
// both lengths needed are written (the name's with its NUL), the call
// returns `ORBITTE_ERR_BUFFER_TOO_SMALL`, and the notification stays
// queued. `ORBITTE_MAX_NOTIF_LEN` bytes always hold a message.
//
// # Safety
// `name_len` and `msg_len` point at writable `size_t`; non-null `name`
// and `msg` at `name_cap` and `msg_cap` writable bytes.
int32_t orbitte_notif_poll(const struct orbitte_engine *engine,
                           uint8_t *name,
                           size_t name_cap,
                           size_t *name_len,
                           uint8_t *msg,
                           size_t msg_cap,
                           size_t *msg_len);

// Sends the `len` bytes at `msg` to `peer` as a notification alone
// (NIXL's `genNotif`): it rides on a one-byte READ of the peer's anchor,
// so it arrives once, like a transfer's. Waits until it was handed to the
// peer's path (up to 30 s). At most `ORBITTE_MAX_NOTIF_LEN` bytes, at
// least one.
//
// # Safety
// `msg` points at `len` readable bytes.
int32_t orbitte_notify(const struct orbitte_engine *engine,
                       orbitte_peer peer,
                       const uint8_t *msg,
                       size_t len);

// The message of the last call on this thread that failed, or NULL when
// the last call succeeded. The text stays valid until the next call of
// this API on the same thread; copy it to keep it.
const char *orbitte_last_error(void);

// Prepares a transfer of `count` descriptors at `descs` with `peer`
// (NIXL's `prepXfer`): `op` is `ORBITTE_OP_READ` or `ORBITTE_OP_WRITE`.
// Every local address must lie in one registration of this engine,
// every remote one in one range the peer published. On success `*out`
// is the transfer, ready to post (and post again once it ended).
//
// # Safety
// `descs` points at `count` readable `orbitte_desc`; `out` at a writable
// `orbitte_xfer`.
int32_t orbitte_xfer_prepare(const struct orbitte_engine *engine,
                             orbitte_peer peer,
                             int32_t op,
                             const struct orbitte_desc *descs,
                             size_t count,
                             orbitte_xfer *out);

// Posts a prepared transfer (NIXL's `postXfer`), with the `notif_len`
// bytes at `notif` as its notification (none when `notif_len` is 0; at
// most `ORBITTE_MAX_NOTIF_LEN`). The peer receives the notification once,
// after every byte of the transfer arrived, and never when a request did
// not complete. Returns `ORBITTE_IN_PROGRESS`, `ORBITTE_OK` when it
// already ended, or a failure's code. Posting again is allowed once it
// ended.
//
// # Safety
// `notif` points at `notif_len` readable bytes.
int32_t orbitte_xfer_post(const struct orbitte_engine *engine,
                          orbitte_xfer xfer,
                          const uint8_t *notif,
                          size_t notif_len);

// Checks a posted transfer without waiting on the network (NIXL's
// `checkXfer`): `ORBITTE_OK` when every byte was placed, the local
// buffers drained and the notification (if any) sent;
// `ORBITTE_IN_PROGRESS` while it moves; a failure's code otherwise
// (`ORBITTE_ERR_BACKEND` for a request that did not complete,
// `ORBITTE_ERR_REMOTE_DISCONNECT` for a peer gone), with
// `orbitte_last_error` saying why. A non-null `status` receives the
// details.
//
// # Safety
// A non-null `status` points at a writable `orbitte_xfer_status`.
int32_t orbitte_xfer_check(const struct orbitte_engine *engine,
                           orbitte_xfer xfer,
                           struct orbitte_xfer_status *status);

// Releases a transfer (NIXL's `releaseReqH`); one in flight is cancelled
// first, and its buffers drained. The handle is invalid afterwards.
//
// # Safety
// None beyond passing values this API returned.
int32_t orbitte_xfer_release(const struct orbitte_engine *engine,
                             orbitte_xfer xfer);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* ORBITTE_H */
