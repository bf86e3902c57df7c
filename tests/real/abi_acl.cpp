// abi_acl.cpp: src/backends/acl_abi.hpp against AscendCL's own acl/acl_rt.h, acl_base_rt.h and
// error_codes/rt_error_codes.h (shipped in the torch-npu wheel, torch_npu/include). Compiled
// with the headers only where they are found; every check is a static_assert.
#include <gtest/gtest.h>

#include <cstdio>

#ifdef HOSTREG_HAVE_ACL_HEADERS
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // aclrtGetVersion is deprecated
#include "acl/acl_rt.h"
#include "acl/error_codes/rt_error_codes.h"

#include "abi_check.hpp"
#include "backends/acl_abi.hpp"

namespace hostreg::acl_abi {
HOSTREG_ACL_SYMBOLS(HRABI_CHECK_FN, HRABI_CHECK_FN)
static_assert(sizeof(aclError) == sizeof(::aclError) &&
              sizeof(aclrtHostRegisterType) == sizeof(::aclrtHostRegisterType));
static_assert(kHostRegMapped == ACL_HOST_REG_MAPPED && kHostRegIoMemory == ACL_HOST_REG_IOMEMORY);
static_assert(kHostRegReadOnly == ACL_HOST_REG_READONLY && kHostRegPinned == ACL_HOST_REG_PINNED);
static_assert(kHostRegisterMapped == ::ACL_HOST_REGISTER_MAPPED);
static_assert(kSuccess == ACL_SUCCESS && kErrorInvalidParam == ::ACL_ERROR_INVALID_PARAM);
static_assert(kErrorUninitialize == ::ACL_ERROR_UNINITIALIZE &&
              kErrorRepeatInitialize == ::ACL_ERROR_REPEAT_INITIALIZE);
static_assert(kErrorBadAlloc == ::ACL_ERROR_BAD_ALLOC && kErrorApiNotSupport == ::ACL_ERROR_API_NOT_SUPPORT);
static_assert(kErrorRtParamInvalid == ACL_ERROR_RT_PARAM_INVALID);
static_assert(kErrorRtInvalidDeviceId == ACL_ERROR_RT_INVALID_DEVICEID);
static_assert(kErrorRtContextNull == ACL_ERROR_RT_CONTEXT_NULL);
static_assert(kErrorRtAddrUnaligned == ACL_ERROR_RT_ADDR_UNALIGNED);
static_assert(kErrorRtFeatureNotSupport == ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
static_assert(kErrorRtMemoryAllocation == ACL_ERROR_RT_MEMORY_ALLOCATION);
static_assert(kErrorRtNoDevice == ACL_ERROR_RT_NO_DEVICE);
static_assert(kErrorRtNoPermission == ACL_ERROR_RT_NO_PERMISSION);
static_assert(kErrorRtInternalError == ACL_ERROR_RT_INTERNAL_ERROR);
static_assert(kErrorRtDrvInternalError == ACL_ERROR_RT_DRV_INTERNAL_ERROR);
static_assert(kErrorHostMemoryAlreadyRegistered == ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
static_assert(kErrorHostMemoryNotRegistered == ACL_ERROR_HOST_MEMORY_NOT_REGISTERED);
}  // namespace hostreg::acl_abi
#endif

TEST(VendorHeaders, Acl) {
#ifdef HOSTREG_HAVE_ACL_HEADERS
    std::printf("checked against %s/acl\n", HOSTREG_VENDOR_INCLUDE_DIR);
#else
    GTEST_SKIP() << "AscendCL headers (acl/acl_rt.h, from the torch-npu wheel) not found: the check was not compiled";
#endif
}
