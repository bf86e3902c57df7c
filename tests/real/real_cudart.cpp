// real_cudart.cpp: hostreg names every code as the real CUDA runtime does. Loads the
// toolkit's libcudart.so (HOSTREG_REAL_CUDART, found by CMake) and compares
// cudaGetErrorName / cudaGetErrorString with hostregGetErrorName / hostregGetErrorString
// for every number from -16 to 20000 and a few beyond: the members of enum cudaError and,
// for the rest, "unrecognized error code". These calls need no driver and no GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hostreg/hostreg.h"

TEST(RealRuntime, CudartNamesEveryCodeAsHostregDoes) {
#ifndef HOSTREG_REAL_CUDART
    GTEST_SKIP() << "no libcudart.so found at configure time";
#else
    void* h = dlopen(HOSTREG_REAL_CUDART, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    auto name = reinterpret_cast<const char* (*)(int)>(dlsym(h, "cudaGetErrorName"));
    auto text = reinterpret_cast<const char* (*)(int)>(dlsym(h, "cudaGetErrorString"));
    ASSERT_NE(name, nullptr);
    ASSERT_NE(text, nullptr);
    std::vector<int> codes;
    for (int c = -16; c <= 20000; ++c)
        codes.push_back(c);
    for (int c : {65535, 1 << 20, 0x7fffffff})
        codes.push_back(c);
    int members = 0;
    for (int c : codes) {
        const std::string real_name = name(c), real_text = text(c);
        ASSERT_EQ(hostregGetErrorName(c), real_name) << c;
        ASSERT_EQ(hostregGetErrorString(c), real_text) << c;
        members += real_name != "unrecognized error code";
    }
    std::printf("%s: %d codes named, all %zu numbers agree with hostreg\n", HOSTREG_REAL_CUDART, members, codes.size());
    EXPECT_GT(members, 100);
#endif
}
