// The suite tests the posix backend (mlock, VmLck, 801 for IoMemory), even where an
// accelerator runtime would be chosen by "auto": pin it before the first hostreg call
// (static initialisation runs before GoogleTest's main).
#include <cstdlib>

namespace {
const bool kPinnedPosix = (setenv("HOSTREG_BACKEND", "posix", 1) == 0);
}  // namespace
