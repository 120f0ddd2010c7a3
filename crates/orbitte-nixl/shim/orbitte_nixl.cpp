// OrbitTE as a NIXL backend engine: each backend call NIXL's agent makes
// is one call of OrbitTE's C API (orbitte.h). Host memory (DRAM_SEG)
// always; CUDA device memory (VRAM_SEG) on the cuda-staging path when the
// CUDA driver reports a device.
//
// Notifications carry one tag byte before the caller's bytes, so that an
// empty NIXL notification (which NIXL allows) is a non-empty OrbitTE one.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend_engine.h"
#include "backend/backend_plugin.h"
#include "orbitte.h"

#if defined(SHIM_OLD_LIBSTDCXX)
// libstdc++ 11 and later call this from std::allocator; the libstdc++ of
// manylinux_2_28 (GLIBCXX_3.4.25) has no such symbol. Defined here, hidden,
// so the plugin loads with that library too.
namespace std {
[[noreturn]] void
__throw_bad_array_new_length() {
    throw std::bad_array_new_length();
}
} // namespace std
#endif

namespace {

constexpr char kNotifTag = 'N';
const char *const kName = "OrbitTE";

// The NIXL status a UCX user gets for the same fault. The C API's codes
// below zero that NIXL has carry NIXL's numbers.
nixl_status_t
toNixl(int32_t rc) {
    switch (rc) {
    case ORBITTE_OK:
        return NIXL_SUCCESS;
    case ORBITTE_IN_PROGRESS:
        return NIXL_IN_PROG;
    case ORBITTE_ERR_NOT_POSTED:
    case ORBITTE_ERR_INVALID_PARAM:
    case ORBITTE_ERR_BACKEND:
    case ORBITTE_ERR_NOT_FOUND:
    case ORBITTE_ERR_MISMATCH:
    case ORBITTE_ERR_NOT_ALLOWED:
    case ORBITTE_ERR_REPOST_ACTIVE:
    case ORBITTE_ERR_NOT_SUPPORTED:
    case ORBITTE_ERR_REMOTE_DISCONNECT:
        return static_cast<nixl_status_t>(rc);
    case ORBITTE_ERR_BAD_HANDLE:
        return NIXL_ERR_INVALID_PARAM;
    default:
        return NIXL_ERR_BACKEND;
    }
}

// Logs the C API's message for a failed call and returns NIXL's status.
nixl_status_t
failed(const char *call, int32_t rc) {
    const char *why = orbitte_last_error();
    NIXL_ERROR << kName << ": " << call << " failed (" << rc << "): " << (why ? why : "no message");
    return toNixl(rc);
}

nixl_status_t
check(const char *call, int32_t rc) {
    return rc < 0 ? failed(call, rc) : toNixl(rc);
}

// Whether CUDA device memory can be registered here (asked once).
bool
cudaAvailable() {
    static const bool available = [] {
        size_t count = 0;
        return orbitte_cuda_devices(&count) == ORBITTE_OK && count > 0;
    }();
    return available;
}

nixl_mem_list_t
supportedMems() {
    if (cudaAvailable()) {
        return {DRAM_SEG, VRAM_SEG};
    }
    return {DRAM_SEG};
}

// Memory types a peer may publish: its engine says what it serves.
bool
remoteMem(nixl_mem_t mem) {
    return mem == DRAM_SEG || mem == VRAM_SEG;
}

bool
localMem(nixl_mem_t mem) {
    return mem == DRAM_SEG || (mem == VRAM_SEG && cudaAvailable());
}

// Local memory this engine registered.
class LocalMD : public nixlBackendMD {
public:
    explicit LocalMD(orbitte_reg reg) : nixlBackendMD(true), reg(reg) {}
    orbitte_reg reg;
};

// Remote memory a peer published (checked by orbitte_load_remote).
class RemoteMD : public nixlBackendMD {
public:
    RemoteMD(std::string agent, std::string data)
        : nixlBackendMD(false),
          agent(std::move(agent)),
          data(std::move(data)) {}
    std::string agent;
    // Its public data, to unload it.
    std::string data;
};

class ReqH : public nixlBackendReqH {
public:
    explicit ReqH(orbitte_xfer xfer) : xfer(xfer) {}
    orbitte_xfer xfer;
};

// Reads a variable-length output of the C API: asks for the length, then
// fills a buffer of it.
template<class Call>
int32_t
readOut(std::string &out, Call call) {
    size_t len = 0;
    int32_t rc = call(nullptr, 0, &len);
    if (rc != ORBITTE_ERR_BUFFER_TOO_SMALL) {
        return rc;
    }
    std::string buf(len, '\0');
    rc = call(reinterpret_cast<uint8_t *>(buf.data()), buf.size(), &len);
    if (rc == ORBITTE_OK) {
        buf.resize(len);
        out = std::move(buf);
    }
    return rc;
}

class OrbitTEEngine : public nixlBackendEngine {
public:
    explicit OrbitTEEngine(const nixlBackendInitParams *init) : nixlBackendEngine(init) {
        std::string listen = param("listen", "0.0.0.0:0");
        std::string secret = param("secret_file", "");
        metricsFile_ = param("metrics_file", "");
        if (metricsFile_.empty()) {
            const char *env = std::getenv("ORBITTE_NIXL_METRICS_FILE");
            metricsFile_ = env ? env : "";
        }
        uint32_t flags = ORBITTE_ENGINE_TOKEN;
        if (param("rdma", "0") == "1") {
            flags |= ORBITTE_ENGINE_RDMA;
        }
        std::string cma = param("cma", "");
        if (cma.empty()) {
            const char *env = std::getenv("ORBITTE_NIXL_CMA");
            cma = env && *env ? env : "1";
        }
        if (cma != "0") {
            flags |= ORBITTE_ENGINE_CMA;
        }
        int32_t rc = orbitte_engine_create(localAgent.c_str(),
                                           listen.c_str(),
                                           secret.empty() ? nullptr : secret.c_str(),
                                           flags,
                                           &engine_);
        if (rc != ORBITTE_OK) {
            failed("orbitte_engine_create", rc);
            engine_ = nullptr;
            initErr = true;
        }
    }

    ~OrbitTEEngine() override {
        if (engine_ != nullptr) {
            orbitte_engine_destroy(engine_);
        }
    }

    bool
    supportsRemote() const override {
        return true;
    }

    bool
    supportsLocal() const override {
        return false;
    }

    bool
    supportsNotif() const override {
        return true;
    }

    nixl_mem_list_t
    getSupportedMems() const override {
        return supportedMems();
    }

    nixl_status_t
    registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) override {
        if (!localMem(nixl_mem)) {
            NIXL_ERROR << kName << ": registerMem: memory type " << static_cast<int>(nixl_mem)
                       << " is not served here (DRAM_SEG, and VRAM_SEG with a CUDA device)";
            return NIXL_ERR_NOT_SUPPORTED;
        }
        orbitte_reg reg = 0;
        int32_t rc = nixl_mem == VRAM_SEG ?
            orbitte_register_device(engine_, mem.addr, mem.len, ORBITTE_REG_REMOTE, &reg) :
            orbitte_register(
                engine_, reinterpret_cast<void *>(mem.addr), mem.len, ORBITTE_REG_REMOTE, &reg);
        if (rc != ORBITTE_OK) {
            return failed(nixl_mem == VRAM_SEG ? "orbitte_register_device" : "orbitte_register",
                          rc);
        }
        out = new LocalMD(reg);
        return NIXL_SUCCESS;
    }

    nixl_status_t
    deregisterMem(nixlBackendMD *meta) override {
        auto *md = dynamic_cast<LocalMD *>(meta);
        if (md == nullptr) {
            return NIXL_ERR_INVALID_PARAM;
        }
        int32_t rc = orbitte_deregister(engine_, md->reg);
        delete md;
        return check("orbitte_deregister", rc);
    }

    nixl_status_t
    getPublicData(const nixlBackendMD *meta, std::string &str) const override {
        auto *md = dynamic_cast<const LocalMD *>(meta);
        if (md == nullptr) {
            return NIXL_ERR_INVALID_PARAM;
        }
        return check("orbitte_public_data", readOut(str, [&](uint8_t *b, size_t c, size_t *l) {
                         return orbitte_public_data(engine_, md->reg, b, c, l);
                     }));
    }

    nixl_status_t
    getConnInfo(std::string &str) const override {
        return check("orbitte_conn_info", readOut(str, [&](uint8_t *b, size_t c, size_t *l) {
                         return orbitte_conn_info(engine_, b, c, l);
                     }));
    }

    nixl_status_t
    loadRemoteConnInfo(const std::string &remote_agent,
                       const std::string &remote_conn_info) override {
        std::lock_guard<std::mutex> g(mu_);
        auto it = connInfo_.find(remote_agent);
        if (it != connInfo_.end() && it->second != remote_conn_info) {
            // The agent came back with new connection info: connect anew.
            dropPeerLocked(remote_agent);
        }
        connInfo_[remote_agent] = remote_conn_info;
        return NIXL_SUCCESS;
    }

    nixl_status_t
    connect(const std::string &remote_agent) override {
        if (remote_agent == localAgent) {
            return NIXL_SUCCESS;
        }
        orbitte_peer peer = 0;
        return peerOf(remote_agent, peer);
    }

    nixl_status_t
    disconnect(const std::string &remote_agent) override {
        std::lock_guard<std::mutex> g(mu_);
        dropPeerLocked(remote_agent);
        return NIXL_SUCCESS;
    }

    nixl_status_t
    loadRemoteMD(const nixlBlobDesc &input,
                 const nixl_mem_t &nixl_mem,
                 const std::string &remote_agent,
                 nixlBackendMD *&output) override {
        if (!remoteMem(nixl_mem)) {
            return NIXL_ERR_NOT_SUPPORTED;
        }
        orbitte_peer peer = 0;
        nixl_status_t st = peerOf(remote_agent, peer);
        if (st != NIXL_SUCCESS) {
            return st;
        }
        int32_t rc = orbitte_load_remote(engine_,
                                         peer,
                                         reinterpret_cast<const uint8_t *>(input.metaInfo.data()),
                                         input.metaInfo.size());
        if (rc != ORBITTE_OK) {
            return failed("orbitte_load_remote", rc);
        }
        output = new RemoteMD(remote_agent, input.metaInfo);
        return NIXL_SUCCESS;
    }

    nixl_status_t
    unloadMD(nixlBackendMD *input) override {
        // Same-host copies stop reaching the memory.
        if (auto *md = dynamic_cast<RemoteMD *>(input)) {
            std::lock_guard<std::mutex> g(mu_);
            auto p = peers_.find(md->agent);
            if (p != peers_.end()) {
                orbitte_unload_remote(engine_,
                                      p->second,
                                      reinterpret_cast<const uint8_t *>(md->data.data()),
                                      md->data.size());
            }
        }
        delete input;
        return NIXL_SUCCESS;
    }

    nixl_status_t
    prepXfer(const nixl_xfer_op_t &operation,
             const nixl_meta_dlist_t &local,
             const nixl_meta_dlist_t &remote,
             const std::string &remote_agent,
             nixlBackendReqH *&handle,
             const nixl_opt_b_args_t * /*opt_args*/ = nullptr) const override {
        if (!localMem(local.getType()) || !remoteMem(remote.getType())) {
            return NIXL_ERR_NOT_SUPPORTED;
        }
        if (local.descCount() != remote.descCount() || local.descCount() == 0) {
            NIXL_ERROR << kName << ": prepXfer: " << local.descCount() << " local and "
                       << remote.descCount() << " remote descriptors";
            return NIXL_ERR_INVALID_PARAM;
        }
        orbitte_peer peer = 0;
        nixl_status_t st = peerOf(remote_agent, peer);
        if (st != NIXL_SUCCESS) {
            return st;
        }
        std::vector<orbitte_desc> descs(local.descCount());
        for (int i = 0; i < local.descCount(); i++) {
            if (local[i].len != remote[i].len) {
                return NIXL_ERR_INVALID_PARAM;
            }
            descs[i] = orbitte_desc{static_cast<uint64_t>(local[i].addr),
                                    static_cast<uint64_t>(remote[i].addr),
                                    static_cast<uint64_t>(local[i].len)};
        }
        orbitte_xfer xfer = 0;
        int32_t rc = orbitte_xfer_prepare(engine_,
                                          peer,
                                          operation == NIXL_READ ? ORBITTE_OP_READ :
                                                                   ORBITTE_OP_WRITE,
                                          descs.data(),
                                          descs.size(),
                                          &xfer);
        if (rc != ORBITTE_OK) {
            return failed("orbitte_xfer_prepare", rc);
        }
        handle = new ReqH(xfer);
        return NIXL_SUCCESS;
    }

    nixl_status_t
    postXfer(const nixl_xfer_op_t & /*operation*/,
             const nixl_meta_dlist_t & /*local*/,
             const nixl_meta_dlist_t & /*remote*/,
             const std::string & /*remote_agent*/,
             nixlBackendReqH *&handle,
             const nixl_opt_b_args_t *opt_args = nullptr) const override {
        auto *req = dynamic_cast<ReqH *>(handle);
        if (req == nullptr) {
            return NIXL_ERR_INVALID_PARAM;
        }
        std::string notif;
        if (opt_args != nullptr && opt_args->hasNotif) {
            if (opt_args->notifMsg.size() + 1 > ORBITTE_MAX_NOTIF_LEN) {
                NIXL_ERROR << kName << ": a notification carries at most "
                           << ORBITTE_MAX_NOTIF_LEN - 1 << " bytes, not "
                           << opt_args->notifMsg.size();
                return NIXL_ERR_INVALID_PARAM;
            }
            notif.reserve(opt_args->notifMsg.size() + 1);
            notif.push_back(kNotifTag);
            notif.append(opt_args->notifMsg);
        }
        int32_t rc = orbitte_xfer_post(
            engine_, req->xfer, reinterpret_cast<const uint8_t *>(notif.data()), notif.size());
        if (rc == ORBITTE_OK) {
            writeMetrics();
        }
        return check("orbitte_xfer_post", rc);
    }

    nixl_status_t
    checkXfer(nixlBackendReqH *handle) const override {
        auto *req = dynamic_cast<ReqH *>(handle);
        if (req == nullptr) {
            return NIXL_ERR_INVALID_PARAM;
        }
        int32_t rc = orbitte_xfer_check(engine_, req->xfer, nullptr);
        if (rc == ORBITTE_OK) {
            writeMetrics();
        }
        return check("orbitte_xfer_check", rc);
    }

    nixl_status_t
    releaseReqH(nixlBackendReqH *handle) const override {
        auto *req = dynamic_cast<ReqH *>(handle);
        if (req == nullptr) {
            return NIXL_ERR_INVALID_PARAM;
        }
        int32_t rc = orbitte_xfer_release(engine_, req->xfer);
        delete req;
        return check("orbitte_xfer_release", rc);
    }

    nixl_status_t
    getNotifs(notif_list_t &notif_list) override {
        // Most notifications are small: the buffers grow when one is not.
        std::string name(256, '\0');
        std::string msg(4096, '\0');
        for (;;) {
            size_t name_len = 0;
            size_t msg_len = 0;
            int32_t rc = orbitte_notif_poll(engine_,
                                            reinterpret_cast<uint8_t *>(name.data()),
                                            name.size(),
                                            &name_len,
                                            reinterpret_cast<uint8_t *>(msg.data()),
                                            msg.size(),
                                            &msg_len);
            if (rc == ORBITTE_EMPTY) {
                return NIXL_SUCCESS;
            }
            if (rc == ORBITTE_ERR_BUFFER_TOO_SMALL) {
                name.resize(std::max(name.size(), name_len));
                msg.resize(std::max(msg.size(), msg_len));
                continue;
            }
            if (rc != ORBITTE_OK) {
                return failed("orbitte_notif_poll", rc);
            }
            if (msg_len == 0 || msg[0] != kNotifTag) {
                NIXL_WARN << kName << ": dropped a notification not sent by this plugin from "
                          << name.substr(0, name_len);
                continue;
            }
            notif_list.emplace_back(name.substr(0, name_len), msg.substr(1, msg_len - 1));
        }
    }

    nixl_status_t
    genNotif(const std::string &remote_agent, const std::string &msg) const override {
        if (msg.size() + 1 > ORBITTE_MAX_NOTIF_LEN) {
            return NIXL_ERR_INVALID_PARAM;
        }
        orbitte_peer peer = 0;
        nixl_status_t st = peerOf(remote_agent, peer);
        if (st != NIXL_SUCCESS) {
            return st;
        }
        std::string tagged(1, kNotifTag);
        tagged.append(msg);
        return check("orbitte_notify",
                     orbitte_notify(engine_,
                                    peer,
                                    reinterpret_cast<const uint8_t *>(tagged.data()),
                                    tagged.size()));
    }

private:
    std::string
    param(const std::string &key, const std::string &fallback) const {
        std::string value;
        if (getInitParam(key, value) == NIXL_SUCCESS && !value.empty()) {
            return value;
        }
        return fallback;
    }

    // The peer of `agent`, connecting with the connection info NIXL loaded
    // for it when there is none yet.
    nixl_status_t
    peerOf(const std::string &agent, orbitte_peer &peer) const {
        std::lock_guard<std::mutex> g(mu_);
        auto p = peers_.find(agent);
        if (p != peers_.end()) {
            peer = p->second;
            return NIXL_SUCCESS;
        }
        auto info = connInfo_.find(agent);
        if (info == connInfo_.end()) {
            NIXL_ERROR << kName << ": no connection info for agent " << agent
                       << ": load its metadata first";
            return NIXL_ERR_NOT_FOUND;
        }
        int32_t rc = orbitte_connect(engine_,
                                     reinterpret_cast<const uint8_t *>(info->second.data()),
                                     info->second.size(),
                                     &peer);
        if (rc != ORBITTE_OK) {
            return failed("orbitte_connect", rc);
        }
        peers_[agent] = peer;
        // Once per connection: how the peer's host memory is reached.
        std::string how;
        uint8_t used = 0;
        if (readOut(how, [&](uint8_t *b, size_t c, size_t *l) {
                return orbitte_peer_cma(engine_, peer, &used, b, c, l);
            }) == ORBITTE_OK) {
            NIXL_DEBUG << kName << ": agent " << agent << ": " << how;
        }
        return NIXL_SUCCESS;
    }

    void
    dropPeerLocked(const std::string &agent) {
        auto p = peers_.find(agent);
        if (p != peers_.end()) {
            orbitte_disconnect(engine_, p->second);
            peers_.erase(p);
        }
    }

    // With `metrics_file` set: the engine's counters, in the Prometheus
    // text format, after each transfer that completed.
    void
    writeMetrics() const {
        if (metricsFile_.empty()) {
            return;
        }
        std::string text;
        if (readOut(text, [&](uint8_t *b, size_t c, size_t *l) {
                return orbitte_metrics(engine_, b, c, l);
            }) != ORBITTE_OK) {
            return;
        }
        std::lock_guard<std::mutex> g(metricsMu_);
        std::string tmp = metricsFile_ + ".tmp";
        FILE *f = std::fopen(tmp.c_str(), "w");
        if (f == nullptr) {
            return;
        }
        std::fwrite(text.data(), 1, text.size(), f);
        std::fclose(f);
        std::rename(tmp.c_str(), metricsFile_.c_str());
    }

    orbitte_engine *engine_ = nullptr;
    std::string metricsFile_;
    mutable std::mutex mu_;
    mutable std::mutex metricsMu_;
    std::unordered_map<std::string, std::string> connInfo_;
    mutable std::unordered_map<std::string, orbitte_peer> peers_;
};

} // namespace

extern "C" __attribute__((visibility("default"))) nixlBackendPlugin *
orbitte_nixl_shim_init() {
    nixl_b_params_t options = {
        {"listen", "0.0.0.0:0"},
        {"secret_file", ""},
        {"rdma", "0"},
        {"metrics_file", ""},
        {"cma", ""},
    };
    return nixlBackendPluginCreator<OrbitTEEngine>::create(
        NIXL_PLUGIN_API_VERSION, kName, PLUGIN_VERSION, options, supportedMems());
}
