// dynlib.cpp: see dynlib.hpp.
#include "backends/dynlib.hpp"

#include <limits.h>
#include <link.h>

#include <cstdlib>
#include <vector>

namespace hostreg {

void DynLib::open(const char* override_env, const char* const* names) {
    std::vector<std::string> candidates;
    for (const char* const* n = names; *n; ++n) candidates.emplace_back(*n);
    const char* forced = std::getenv(override_env);
    if (forced && *forced) {
        if (forced[0] != '/') {
            status_ = Status::error(hostregErrorInitializationError,
                                    std::string(override_env) + "=" + forced +
                                        " is not an absolute path; refusing to load it");
            return;
        }
        candidates = {forced};
    }
    std::string errors;
    for (const std::string& name : candidates) {
        dlerror();
        handle_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle_) break;
        const char* e = dlerror();
        errors += (errors.empty() ? "" : "; ") + (e ? std::string(e) : name);
    }
    if (!handle_) {
        status_ = Status::error(hostregErrorInitializationError, "cannot load the runtime: " + errors);
        return;
    }
    const link_map* map = nullptr;
    if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) {
        char real[PATH_MAX];
        path_ = realpath(map->l_name, real) ? real : map->l_name;  // the file itself, not a link to it
    }
}

Status DynLib::missing(const char* sym) const {
    return Status::error(hostregErrorInitializationError,
                         path_ + " lacks the symbol " + sym + " (runtime too old or not the right library)");
}

}  // namespace hostreg
