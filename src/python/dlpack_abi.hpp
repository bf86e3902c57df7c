// dlpack_abi.hpp: the part of DLPack's stable C ABI (dlpack.h, v0.8) the extension hands
// torch: DLManagedTensor and what it holds, field for field, so no DLPack header is needed.
#pragma once

#include <cstdint>

namespace hostreg_py {

// Views of memory for torch: one uint8 tensor of exactly nbytes whose deleter drops a reference to the
// Python object that owns the memory, so that memory lives as long as any tensor viewing it.
struct DLDevice {
    int32_t device_type;  // kDLCPU = 1
    int32_t device_id;
};
struct DLDataType {
    uint8_t code;  // kDLUInt = 1
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensor {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
};
struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor*);
};
}  // namespace hostreg_py
