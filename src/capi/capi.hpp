// capi.hpp: what the C ABI files share.
#pragma once

#include <string>

#include "core/status.hpp"

namespace hostreg {

// Records and returns 1 (cudaErrorInvalidValue) for a NULL out-parameter named `what` of the
// C ABI function `call`.
inline int null_out(const char* what, const char* call) {
    return record(Status::error(hostregErrorInvalidValue, std::string(what) + " is NULL"), call);
}

}  // namespace hostreg
