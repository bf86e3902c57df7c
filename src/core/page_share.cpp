// page_share.cpp: see page_share.hpp.
#include "core/page_share.hpp"

namespace hostreg {
namespace {

// The pieces of [lo, hi) for granule g: a partial first granule (edge), the whole granules,
// a partial last granule (edge). Any of them may be absent; a range inside one granule that
// does not fill it is a single edge.
struct Layout {
    bool head = false, tail = false;
    uintptr_t head_at = 0, tail_at = 0;
    uintptr_t mid_lo = 0, mid_hi = 0;  // [mid_lo, mid_hi), empty when equal
};

Layout layout(uintptr_t lo, size_t bytes, size_t g) {
    const uintptr_t mask = ~(static_cast<uintptr_t>(g) - 1);
    const uintptr_t hi = lo + bytes;
    const uintptr_t first = lo & mask, last = (hi - 1) & mask;
    Layout l;
    const bool head_partial = (lo & ~mask) != 0, tail_partial = (hi & ~mask) != 0;
    if (first == last && (head_partial || tail_partial)) {
        l.head = true;
        l.head_at = first;
        return l;
    }
    l.head = head_partial;
    l.head_at = first;
    l.tail = tail_partial;
    l.tail_at = last;
    l.mid_lo = head_partial ? first + g : first;
    l.mid_hi = tail_partial ? last : last + g;
    return l;
}

}  // namespace

// The lock is held across the runtime's call, so that no other registration can see a granule
// half registered or half released (edge calls are one granule each).
Status PageShare::hold_edge(const Backend& be, uintptr_t at, size_t g, unsigned flags, Piece* piece) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = edges_.try_emplace(at);
    Edge& e = it->second;
    // An edge with no holder is one the runtime refused to unregister: still registered there,
    // so it is taken over, not registered again.
    Status s = fresh ? be.host_register(reinterpret_cast<void*>(at), g, flags, &e.piece)
                     : be.share(reinterpret_cast<void*>(at), g, e.piece);
    if (!s.is_ok()) {
        if (fresh) edges_.erase(it);
        return s;
    }
    ++e.holders;
    *piece = e.piece;
    return s;
}

Status PageShare::drop_edge(const Backend& be, uintptr_t at, size_t g) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = edges_.find(at);
    if (it == edges_.end() || it->second.holders == 0 || --it->second.holders > 0) return Status::ok();
    Status s = be.host_unregister(reinterpret_cast<void*>(at), g, it->second.piece);
    // Gone from the runtime (or it no longer knew it: 713): forget it. Refused otherwise: keep
    // it, holder-less, for the next registration that touches this granule to take over.
    if (s.is_ok() || s.code == hostregErrorHostMemoryNotRegistered) edges_.erase(it);
    return s;
}

Status PageShare::acquire(const Backend& be, uintptr_t lo, size_t bytes, unsigned flags, size_t g, Piece* middle,
                          void** device) {
    const Layout l = layout(lo, bytes, g);
    struct Held {
        uintptr_t at;
        size_t len;
        bool edge;
        Piece piece;
    };
    Held held[3];  // in address order
    size_t n = 0;
    auto undo = [&] {
        for (size_t i = 0; i < n; ++i) {
            if (held[i].edge)
                drop_edge(be, held[i].at, g);
            else
                be.host_unregister(reinterpret_cast<void*>(held[i].at), held[i].len, held[i].piece);
        }
    };
    *middle = Piece{};
    if (l.head) {
        Held h{l.head_at, g, true, {}};
        if (Status s = hold_edge(be, h.at, g, flags, &h.piece); !s.is_ok()) return s;
        held[n++] = h;
    }
    if (l.mid_hi > l.mid_lo) {
        Held h{l.mid_lo, l.mid_hi - l.mid_lo, false, {}};
        if (Status s = be.host_register(reinterpret_cast<void*>(h.at), h.len, flags, &h.piece); !s.is_ok()) {
            undo();
            return s;
        }
        *middle = h.piece;
        held[n++] = h;
    }
    if (l.tail) {
        Held h{l.tail_at, g, true, {}};
        if (Status s = hold_edge(be, h.at, g, flags, &h.piece); !s.is_ok()) {
            undo();
            return s;
        }
        held[n++] = h;
    }
    // One device address for the whole range only if the runtime mapped the pieces back to
    // back, as a single registration would be.
    bool contiguous = held[0].piece.device != nullptr;
    for (size_t i = 1; contiguous && i < n; ++i)
        contiguous = held[i].piece.device == static_cast<char*>(held[i - 1].piece.device) + held[i - 1].len;
    *device = contiguous ? static_cast<char*>(held[0].piece.device) + (lo - held[0].at) : nullptr;
    return Status::ok();
}

Status PageShare::release(const Backend& be, uintptr_t lo, size_t bytes, size_t g, const Piece& middle,
                          bool* released) {
    const Layout l = layout(lo, bytes, g);
    *released = false;
    Status mid;
    if (l.mid_hi > l.mid_lo) {
        mid = be.host_unregister(reinterpret_cast<void*>(l.mid_lo), l.mid_hi - l.mid_lo, middle);
        // 713: the runtime no longer holds the middle (the registry forgets the registration
        // then), so the edges go too; any other failure leaves everything as it was.
        if (!mid.is_ok() && mid.code != hostregErrorHostMemoryNotRegistered) return mid;
    }
    *released = true;
    Status head = l.head ? drop_edge(be, l.head_at, g) : Status::ok();
    Status tail = l.tail ? drop_edge(be, l.tail_at, g) : Status::ok();
    return !mid.is_ok() ? mid : !head.is_ok() ? head : tail;
}

}  // namespace hostreg
