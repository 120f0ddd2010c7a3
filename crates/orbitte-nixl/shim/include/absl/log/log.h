// A stand-in for absl/log/log.h, enough for NIXL's common/nixl_log.h:
// LOG(severity), VLOG(n) and DVLOG(n) as stream sinks. Warnings, errors
// and fatal lines go to stderr; INFO lines are dropped, and VLOG lines
// too unless NIXL's NIXL_LOG_LEVEL is DEBUG or TRACE. FATAL aborts. Written for OrbitTE's NIXL plugin; not Abseil's code.
#ifndef ORBITTE_NIXL_ABSL_LOG_LOG_H
#define ORBITTE_NIXL_ABSL_LOG_LOG_H

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

namespace orbitte_nixl_log {

enum class Severity { INFO, WARNING, ERROR, FATAL };

// Whether VLOG lines are shown: NIXL_LOG_LEVEL=DEBUG or TRACE (read once).
inline bool
verbose() {
    static const bool shown = [] {
        const char *level = std::getenv("NIXL_LOG_LEVEL");
        if (level == nullptr) {
            return false;
        }
        std::string l(level);
        return l == "DEBUG" || l == "TRACE" || l == "debug" || l == "trace";
    }();
    return shown;
}

class Line {
public:
    Line(Severity severity, bool shown) : severity_(severity), shown_(shown) {}
    Line(const Line &) = delete;
    Line &operator=(const Line &) = delete;
    ~Line() {
        if (shown_) {
            static const char *const names[] = {"INFO", "WARNING", "ERROR", "FATAL"};
            std::cerr << "[OrbitTE NIXL plugin " << names[static_cast<int>(severity_)] << "] ";
            // The buffer, not str(): C++20's str() is a libstdc++ symbol newer
            // than manylinux_2_28 allows. An empty buffer would set failbit.
            if (text_.tellp() > 0) {
                std::cerr << text_.rdbuf();
            }
            std::cerr << std::endl;
        }
        if (severity_ == Severity::FATAL) {
            std::abort();
        }
    }
    template<class T> Line &operator<<(const T &value) {
        if (shown_) {
            text_ << value;
        }
        return *this;
    }
    Line &WithPerror() { return *this; }

private:
    Severity severity_;
    bool shown_;
    // Constructed with the mode: the default constructor is a libstdc++
    // symbol newer than manylinux_2_28 allows. Readable (in), so the
    // destructor can stream the buffer out.
    std::ostringstream text_{std::ios_base::in | std::ios_base::out};
};

} // namespace orbitte_nixl_log

#define LOG(severity)                                                          \
    ::orbitte_nixl_log::Line(::orbitte_nixl_log::Severity::severity,           \
                             ::orbitte_nixl_log::Severity::severity !=         \
                                 ::orbitte_nixl_log::Severity::INFO)
#define VLOG(level)                                                            \
    ::orbitte_nixl_log::Line(::orbitte_nixl_log::Severity::INFO, ::orbitte_nixl_log::verbose())
#define DVLOG(level) VLOG(level)

#endif
