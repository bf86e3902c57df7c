// dynlib.cpp: see dynlib.hpp.
#include "backends/dynlib.hpp"

#include <link.h>

#include <cstdlib>
#include <vector>

namespace hostreg {

DynLib::DynLib(const char* override_env, std::initializer_list<const char*> names) {
    std::vector<std::string> candidates(names.begin(), names.end());
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
    if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) path_ = map->l_name;
}

const Status& DynLib::missing(const char* sym) {
    status_ = Status::error(hostregErrorInitializationError,
                            path_ + " lacks the symbol " + sym + " (runtime too old or not the right library)");
    return status_;
}

}  // namespace hostreg
