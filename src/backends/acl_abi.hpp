// acl_abi.hpp: the part of Huawei's AscendCL (libascendcl.so, CANN) hostreg calls, written
// from CANN's include/external/acl/acl_rt.h, acl_base_rt.h and error_codes/rt_error_codes.h
// (hicann/runtime; the same files ship in torch_npu's wheels under torch_npu/include/acl):
// types, constants and the symbol list. No vendor header is needed to build;
// tests/real/abi_acl.cpp checks every line against the real headers.
#pragma once

#include <cstdint>

namespace hostreg::acl_abi {

using aclError = int;
using aclrtHostRegisterType = int;  // enum aclrtHostRegisterType
using aclrtContext = void*;         // typedef void *aclrtContext (acl_base_rt.h)

// Constants carry the vendor's name in a comment (the vendor's own names are macros in its
// headers, which tests/real includes beside this file).
// aclrtHostRegisterV2 flags (acl_rt.h).
constexpr uint32_t kHostRegMapped = 0x2;         // ACL_HOST_REG_MAPPED
constexpr uint32_t kHostRegIoMemory = 0x4;       // ACL_HOST_REG_IOMEMORY
constexpr uint32_t kHostRegReadOnly = 0x8;       // ACL_HOST_REG_READONLY
constexpr uint32_t kHostRegPinned = 0x10000000;  // ACL_HOST_REG_PINNED
// aclrtHostRegister (V1) types.
constexpr aclrtHostRegisterType kHostRegisterMapped = 0;  // ACL_HOST_REGISTER_MAPPED

// Codes (acl_base_rt.h, rt_error_codes.h).
constexpr aclError kSuccess = 0;                                // ACL_SUCCESS
constexpr aclError kErrorInvalidParam = 100000;                 // ACL_ERROR_INVALID_PARAM
constexpr aclError kErrorUninitialize = 100001;                 // ACL_ERROR_UNINITIALIZE
constexpr aclError kErrorRepeatInitialize = 100002;             // ACL_ERROR_REPEAT_INITIALIZE
constexpr aclError kErrorBadAlloc = 200000;                     // ACL_ERROR_BAD_ALLOC
constexpr aclError kErrorApiNotSupport = 200001;                // ACL_ERROR_API_NOT_SUPPORT
constexpr aclError kErrorRtParamInvalid = 107000;               // ACL_ERROR_RT_PARAM_INVALID
constexpr aclError kErrorRtInvalidDeviceId = 107001;            // ACL_ERROR_RT_INVALID_DEVICEID
constexpr aclError kErrorRtContextNull = 107002;                // ACL_ERROR_RT_CONTEXT_NULL
constexpr aclError kErrorRtAddrUnaligned = 107008;              // ACL_ERROR_RT_ADDR_UNALIGNED
constexpr aclError kErrorRtFeatureNotSupport = 207000;          // ACL_ERROR_RT_FEATURE_NOT_SUPPORT
constexpr aclError kErrorRtMemoryAllocation = 207001;           // ACL_ERROR_RT_MEMORY_ALLOCATION
constexpr aclError kErrorRtNoDevice = 207004;                   // ACL_ERROR_RT_NO_DEVICE
constexpr aclError kErrorRtNoPermission = 207006;               // ACL_ERROR_RT_NO_PERMISSION
constexpr aclError kErrorRtInternalError = 507000;              // ACL_ERROR_RT_INTERNAL_ERROR
constexpr aclError kErrorRtDrvInternalError = 507899;           // ACL_ERROR_RT_DRV_INTERNAL_ERROR
constexpr aclError kErrorHostMemoryAlreadyRegistered = 507910;  // ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED
constexpr aclError kErrorHostMemoryNotRegistered = 507911;      // ACL_ERROR_HOST_MEMORY_NOT_REGISTERED

#define HOSTREG_ACL_SYMBOLS(REQUIRED, OPTIONAL)                                             \
    REQUIRED(aclInit, aclError, (const char*))                                              \
    REQUIRED(aclrtSetDevice, aclError, (int32_t))                                           \
    REQUIRED(aclrtGetDevice, aclError, (int32_t*))                                          \
    REQUIRED(aclrtGetDeviceCount, aclError, (uint32_t*))                                    \
    REQUIRED(aclrtHostRegister, aclError, (void*, uint64_t, aclrtHostRegisterType, void**)) \
    REQUIRED(aclrtHostUnregister, aclError, (void*))                                        \
    REQUIRED(aclGetRecentErrMsg, const char*, (void))                                       \
    OPTIONAL(aclrtHostRegisterV2, aclError, (void*, uint64_t, uint32_t))                    \
    OPTIONAL(aclrtHostGetDevicePointer, aclError, (void*, void**, uint32_t))                \
    OPTIONAL(aclrtGetVersion, aclError, (int32_t*, int32_t*, int32_t*))                     \
    OPTIONAL(aclrtGetCurrentContext, aclError, (aclrtContext*))                             \
    OPTIONAL(aclrtSetCurrentContext, aclError, (aclrtContext))

}  // namespace hostreg::acl_abi
