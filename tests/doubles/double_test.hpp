// double_test.hpp: what the tests of the vendor TEST DOUBLES share (test_<vendor>_double.cpp
// check that each double behaves as the header comment of its source promises, by calling
// its exported C ABI through dlopen/dlsym exactly as a hostreg backend would).
//
// Every test gets a FRESH instance of its double: the library at its absolute build path
// (HOSTREG_DOUBLE_*_PATH, from CMake) is copied to a private temporary file and dlopened
// from there, so each test starts with the double not initialized, no contexts, no
// registrations and zero counters, whether ctest runs the tests one per process or the
// binary runs them all in one. The export test opens the build paths themselves.
//
// Real locking is checked with the kernel's own count, VmLck in /proc/self/status.
#pragma once

#include <dlfcn.h>
#include <elf.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/memory.hpp"  // page(), vmlck_kb(), pages_kb(), Mapping

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hrd_test {

// ---------------------------------------------------------------------------------------
// Memory helpers

using hrtest::Bytes;
using hrtest::Mapping;
using hrtest::page;
using hrtest::pages_kb;
using hrtest::vmlck_kb;

// Three pages with the middle one unmapped: mlock of the whole range fails (ENOMEM).
class Holey {
  public:
    Holey() : map_(3) {
        if (map_.get()) munmap(map_.get() + page(), page());
    }
    char* get() const { return map_.get(); }
    size_t size() const { return 3 * page(); }

  private:
    Mapping map_;
};

// ---------------------------------------------------------------------------------------
// Loading doubles

// A fresh instance of the double at `path` (see the header comment). The copy goes to
// $TMPDIR (or /tmp), else, where that is not usable (e.g. mounted noexec), beside the
// original. Never unloaded.
class Lib {
  public:
    explicit Lib(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (image.empty()) {
            error_ = "cannot read " + path;
            return;
        }
        const char* tmp = getenv("TMPDIR");
        const std::string beside = path.substr(0, path.rfind('/'));
        for (const std::string& parent : {std::string(tmp && *tmp ? tmp : "/tmp"), beside}) {
            if (load_copy(image, parent, path.substr(path.rfind('/') + 1))) return;
        }
    }
    bool loaded() const { return handle_ != nullptr; }
    const std::string& error() const { return error_; }
    void* sym(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

    // The inspection API every double exports.
    long calls(const char* symbol) const {
        return reinterpret_cast<long (*)(const char*)>(sym("hostreg_double_calls"))(symbol);
    }
    unsigned last_flags() const { return reinterpret_cast<unsigned (*)()>(sym("hostreg_double_last_flags"))(); }
    long live() const { return reinterpret_cast<long (*)()>(sym("hostreg_double_live"))(); }
    void reset() const { reinterpret_cast<void (*)()>(sym("hostreg_double_reset"))(); }
    std::vector<unsigned> flags_log() const {
        auto fn = reinterpret_cast<long (*)(unsigned*, long)>(sym("hostreg_double_flags_log"));
        std::vector<unsigned> out(static_cast<size_t>(fn(nullptr, 0)));
        fn(out.data(), static_cast<long>(out.size()));
        return out;
    }
    std::string kind(const void* p) const {
        const char* k = reinterpret_cast<const char* (*)(const void*)>(sym("hostreg_double_kind"))(p);
        return k ? k : "<unregistered>";
    }

  private:
    // Writes image to <parent>/hostreg_double_XXXXXX/<name>, dlopens it, removes the file.
    bool load_copy(const std::string& image, const std::string& parent, const std::string& name) {
        std::string dir = parent + "/hostreg_double_XXXXXX";
        if (!mkdtemp(&dir[0])) {
            error_ += "cannot make a directory in " + parent + "; ";
            return false;
        }
        const std::string copy = dir + "/" + name;
        {
            std::ofstream out(copy, std::ios::binary);
            out.write(image.data(), static_cast<std::streamsize>(image.size()));
        }
        handle_ = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) error_ += std::string(dlerror()) + "; ";
        unlink(copy.c_str());
        rmdir(dir.c_str());
        return handle_ != nullptr;
    }

    void* handle_ = nullptr;
    std::string error_;
};

// Loads the function `name` of the fixture's `lib_` into the member of the same name.
#define LOAD(name)                                                             \
    do {                                                                       \
        name = reinterpret_cast<decltype(name)>(lib_->sym(#name));             \
        ASSERT_NE(reinterpret_cast<void*>(name), nullptr) << #name " missing"; \
    } while (0)

const char* const kKnobs[] = {"HOSTREG_DOUBLE_DEVICES", "HOSTREG_DOUBLE_STUB", "HOSTREG_DOUBLE_NO_READONLY",
                              "HOSTREG_DOUBLE_ACL_PIN_REGISTER", "HOSTREG_DOUBLE_ZE_NO_IMPORT"};

// Common fixture: a fresh double, knobs unset, the VmLck baseline, and at the end the
// promise that the test left no registration (and so no lock) behind.
class DoubleTest : public ::testing::Test {
  protected:
    void open(const char* path) {
        for (const char* knob : kKnobs)
            unsetenv(knob);
        lib_ = std::make_unique<Lib>(path);
        ASSERT_TRUE(lib_->loaded()) << lib_->error();
        vmlck0_ = vmlck_kb();
        ASSERT_GE(vmlck0_, 0);
    }
    void TearDown() override {
        if (lib_ && lib_->loaded()) {
            EXPECT_EQ(lib_->live(), 0) << "test left registrations behind";
        }
        for (const char* knob : kKnobs)
            unsetenv(knob);
    }
    long locked_kb() const { return vmlck_kb() - vmlck0_; }

    std::unique_ptr<Lib> lib_;
    long vmlck0_ = 0;
};

// ---------------------------------------------------------------------------------------
// Exports: each double exports exactly the vendor functions it promises plus the
// inspection API (-fvisibility=hidden everywhere else), read from the ELF dynamic symbol
// table of the built library.

inline std::set<std::string> defined_exports(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::set<std::string> out;
    if (image.size() < sizeof(Elf64_Ehdr)) return out;
    const char* data = image.data();
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(data);
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(data + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_type != SHT_DYNSYM) continue;
        const char* names = data + sh[sh[i].sh_link].sh_offset;
        const auto* syms = reinterpret_cast<const Elf64_Sym*>(data + sh[i].sh_offset);
        const size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 1; k < n; ++k) {
            const int bind = ELF64_ST_BIND(syms[k].st_info);
            if (syms[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
            out.insert(names + syms[k].st_name);
        }
    }
    return out;
}

inline const std::vector<std::string> kInspection = {"hostreg_double_calls",     "hostreg_double_last_flags",
                                                     "hostreg_double_live",      "hostreg_double_reset",
                                                     "hostreg_double_flags_log", "hostreg_double_kind"};

inline void expect_exports(const char* path, std::vector<std::string> vendor) {
    vendor.insert(vendor.end(), kInspection.begin(), kInspection.end());
    const std::set<std::string> expected(vendor.begin(), vendor.end());
    EXPECT_EQ(defined_exports(path), expected) << path;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // the build path itself
    ASSERT_NE(h, nullptr) << dlerror();
    for (const std::string& name : expected)
        EXPECT_NE(dlsym(h, name.c_str()), nullptr) << name;
}

}  // namespace hrd_test
