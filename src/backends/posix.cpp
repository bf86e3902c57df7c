// posix.cpp: the no-accelerator backend. Page-locks with mlock(2).
//
// This is honest OS page-locking: the pages are resident and stay resident (VmLck in
// /proc/self/status counts them). It is NOT DMA registration for a GPU: a device copy engine
// gains little from mlock alone (H200 D2H into mlock'd memory 14-16 GB/s vs 52-55 GB/s into
// registered memory, DeepSpeed PR #8283; docs/vendors.md "POSIX").
//
// Facts used (mlock(2)): Linux rounds the address down to a page; errno ENOMEM means the
// range is not fully mapped or the lock would pass RLIMIT_MEMLOCK without CAP_IPC_LOCK;
// EAGAIN means some pages could not be locked; locks do not nest: one munlock unlocks a page
// however often it was locked.
//
// Because locks do not nest, the backend's granule is a page: the registry hands it whole
// pages and shares a page that two registrations both touch (core/page_share.hpp), so
// neither unregister unlocks the other's page.
#include <cerrno>
#include <cstdint>

#include "backends/page_lock.hpp"
#include "core/backend.hpp"
#include "core/memory_map.hpp"

namespace hostreg {
namespace {

Status posix_register(void* ptr, size_t bytes, unsigned /*flags*/, Piece* piece) {
    if (Status s = lock_range(reinterpret_cast<uintptr_t>(ptr), bytes); !s.is_ok()) return s;  // nothing left locked
    piece->device = ptr;  // the CPU is the device: its address is the host address
    return Status::ok();
}

// Locked again when one more registration shares an edge page: mlock is idempotent, and the
// page's holder may be stale (its memory unmapped while registered, which dropped the lock).
Status posix_share(void* ptr, size_t bytes, const Piece& /*piece*/) {
    return lock_range(reinterpret_cast<uintptr_t>(ptr), bytes, /*undo=*/false);  // a neighbour holds it
}

Status posix_unregister(void* ptr, size_t bytes, const Piece& /*piece*/) {
    // munlock fails with ENOMEM only where the memory was unmapped meanwhile, which already
    // dropped its lock; the registration is gone either way.
    unlock_pages(reinterpret_cast<uintptr_t>(ptr), bytes);
    return Status::ok();
}

const Probe& posix_probe() {
    static const Probe* probe = [] {
        auto* p = new Probe();  // leaked, like every backend's: usable during exit
        p->caps.flags = HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY;
        p->caps.granule = page_size();  // mlock works on pages, and its locks do not nest
        p->caps.version = "mlock(2)";
        p->caps.note =
            "page-locked by the OS with mlock(2): resident and locked (VmLck counts it), but not registered "
            "with any device's DMA engine";
        return p;
    }();
    return *probe;
}

}  // namespace

extern const Backend kPosixBackend = {
    /*name=*/"posix",
    /*probe=*/posix_probe,
    /*host_register=*/posix_register,
    /*host_unregister=*/posix_unregister,
    /*share=*/posix_share,
    /*set_default_device=*/defaults::set_default_device,  // no devices
    /*room=*/lock_room,
};

}  // namespace hostreg
