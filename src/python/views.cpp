// views.cpp: views of memory handed to torch as DLPack capsules (torch.from_dlpack), each
// holding a reference to the Python object that owns the memory until torch frees the last
// tensor made from it; see common.hpp for the extension's files.
#include <cstdint>
#include <vector>

#include "common.hpp"
#include "dlpack_abi.hpp"
#include "hostreg/hostreg.h"

namespace hostreg_py {
namespace {

struct BytesView {
    DLManagedTensor managed;
    std::vector<int64_t> dims;  // the shape, then the strides (typed views)
    PyObject* owner;
    bool unregister = false;  // pinned_view: undo the owner's registration first (owner.live)
};

// The owner's registration of the view's bytes, undone here in C when owner.live is true: a
// Python finalizer could be interrupted (a KeyboardInterrupt raised at its first line is
// ignored there) and leave freed memory registered. Called with the GIL.
void unregister_owned(BytesView* v) {
    PyObject* held = take_error();  // the caller's exception in flight (an interrupt) stays its own
    PyObject* live = PyObject_GetAttrString(v->owner, "live");
    const int on = live ? PyObject_IsTrue(live) : 0;
    Py_XDECREF(live);
    if (on == 1) {
        hostregHostUnregister(v->managed.dl_tensor.data);
        PyObject_SetAttrString(v->owner, "live", Py_False);
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(v->owner);
    restore_error(held);
}

void drop_view(DLManagedTensor* m) {
    auto* v = static_cast<BytesView*>(m->manager_ctx);
    // Any thread may free the last tensor; at interpreter exit the owner is left to the OS.
    if (interpreter_running()) {
        PyGILState_STATE g = PyGILState_Ensure();
        if (v->unregister) unregister_owned(v);
        Py_DECREF(v->owner);
        PyGILState_Release(g);
    }
    delete v;
}

void capsule_gone(PyObject* capsule) {
    // Never handed to torch (which renames it "used_dltensor"): free it here.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        m->deleter(m);
    }
}

// The DLPack capsule of view v (its dl_tensor filled in, its owner referenced): torch takes it
// over in torch.from_dlpack; a capsule never taken frees v when it goes (capsule_gone).
nb::object capsule_of(BytesView* v) {
    v->managed.manager_ctx = v;
    v->managed.deleter = drop_view;
    PyObject* cap = PyCapsule_New(&v->managed, "dltensor", capsule_gone);
    if (!cap) {
        drop_view(&v->managed);
        throw nb::python_error();
    }
    return nb::steal(cap);
}

}  // namespace

// A DLPack capsule of nbytes uint8 at ptr whose tensors keep owner (any object) alive; with
// unregister, the release of the last of them first undoes the registration at ptr when
// owner.live is true (see unregister_owned).
nb::object view_of(nb::handle owner, uintptr_t ptr, size_t nbytes, bool unregister) {
    auto* v = new BytesView{};
    v->unregister = unregister;
    v->dims.assign(1, static_cast<int64_t>(nbytes));
    v->owner = owner.ptr();
    Py_INCREF(v->owner);
    v->managed.dl_tensor = DLTensor{as_ptr(ptr), DLDevice{1, 0}, 1, DLDataType{1, 8, 1}, v->dims.data(), nullptr, 0};
    return capsule_of(v);
}

// A DLPack capsule of a tensor of dtype (DLPack's code | bits << 8), shape and strides (in
// elements) at ptr, whose tensors keep owner alive. The caller has checked that its bytes lie
// in owner's memory.
nb::object typed_view(nb::handle owner, uintptr_t ptr, uint32_t dtype, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides) {
    auto* v = new BytesView{};
    v->dims.reserve(2 * shape.size() + 1);
    v->dims.insert(v->dims.end(), shape.begin(), shape.end());
    v->dims.insert(v->dims.end(), strides.begin(), strides.end());
    v->owner = owner.ptr();
    Py_INCREF(v->owner);
    DLTensor& t = v->managed.dl_tensor;
    t = DLTensor{};
    t.data = as_ptr(ptr);
    t.device = DLDevice{1, 0};  // kDLCPU
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = DLDataType{static_cast<uint8_t>(dtype & 0xff), static_cast<uint8_t>(dtype >> 8), 1};
    t.shape = v->dims.data();
    t.strides = v->dims.data() + t.ndim;
    return capsule_of(v);
}

}  // namespace hostreg_py
