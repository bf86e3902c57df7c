// dynlib.cpp: see dynlib.hpp.
#include "backends/dynlib.hpp"

#include <limits.h>
#include <link.h>

#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace hostreg {
namespace {

// The dynamic loader treats an empty or relative element of LD_LIBRARY_PATH (what
// "$LD_LIBRARY_PATH:/x" gives when it was unset) as the working directory, or a directory
// below it. Is `name` there in such an element, so that dlopen(name) would load it?
bool in_a_relative_search_dir(const std::string& name) {
    const char* env = std::getenv("LD_LIBRARY_PATH");
    if (!env) return false;
    const std::string path = env;
    for (size_t at = 0;;) {
        const size_t colon = path.find_first_of(":;", at);
        const std::string dir = path.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
        if ((dir.empty() || dir[0] != '/') && access(((dir.empty() ? "." : dir) + "/" + name).c_str(), F_OK) == 0)
            return true;
        if (colon == std::string::npos) return false;
        at = colon + 1;
    }
}

// The absolute directories of the loader's search path, in its order (RTLD_DI_SERINFO:
// LD_LIBRARY_PATH, the program's RUNPATH, the system directories).
std::vector<std::string> absolute_search_dirs() {
    std::vector<std::string> dirs;
    void* self = dlopen(nullptr, RTLD_NOW);
    Dl_serinfo size{};
    if (!self || dlinfo(self, RTLD_DI_SERINFOSIZE, &size) != 0) return dirs;
    std::vector<char> buf(size.dls_size);
    auto* info = reinterpret_cast<Dl_serinfo*>(buf.data());
    *info = size;
    if (dlinfo(self, RTLD_DI_SERINFO, info) != 0) return dirs;
    for (unsigned i = 0; i < info->dls_cnt; ++i)
        if (info->dls_serpath[i].dls_name && info->dls_serpath[i].dls_name[0] == '/')
            dirs.emplace_back(info->dls_serpath[i].dls_name);
    return dirs;
}

}  // namespace

void DynLib::open(const char* override_env, const char* const* names) {
    std::vector<std::string> candidates;
    for (const char* const* n = names; *n; ++n)
        candidates.emplace_back(*n);
    const char* forced = std::getenv(override_env);
    if (forced && *forced) {
        if (forced[0] != '/') {
            status_ =
                Status::error(hostregErrorInitializationError, std::string(override_env) + "=" + forced +
                                                                   " is not an absolute path; refusing to load it");
            return;
        }
        candidates = {forced};
    }
    std::string errors;
    auto try_open = [&](const std::string& file) {
        dlerror();
        handle_ = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
        const char* e = handle_ ? nullptr : dlerror();
        if (e) errors += (errors.empty() ? "" : "; ") + std::string(e);
        return handle_ != nullptr;
    };
    for (const std::string& name : candidates) {
        if (name.find('/') != std::string::npos || !in_a_relative_search_dir(name)) {
            if (try_open(name)) break;
            continue;
        }
        // Never from the working directory: look in the absolute directories only.
        errors += (errors.empty() ? "" : "; ") + name + " in the working directory (an empty or relative " +
                  "LD_LIBRARY_PATH element) was not loaded";
        bool found = false;
        for (const std::string& dir : absolute_search_dirs())
            if (access((dir + "/" + name).c_str(), F_OK) == 0 && try_open(dir + "/" + name)) {
                found = true;
                break;
            }
        if (found) break;
    }
    if (!handle_) {
        not_found_ = true;
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
