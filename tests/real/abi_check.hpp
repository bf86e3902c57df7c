// abi_check.hpp: compile-time checks that hostreg's own description of a vendor ABI
// (src/backends/<vendor>_abi.hpp, written without vendor headers) matches the vendor's real
// header: same function types, same constant values.
//
// "Same type" is ABI identity as the C calling convention sees it: the same number of
// parameters, and each parameter and the result of the same kind and size (integers and
// enums of one size; pointers to the same kind of thing, const-ness included; opaque handle
// types such as struct CUctx_st* match any pointer to a struct). Usage, inside the vendor's
// hostreg namespace so that hostreg's type names win over the vendor's:
//
//   #define CHECK(name, ret, args) static_assert(hrabi::same_fn<ret(*) args, decltype(&::name)>, #name);
//   HOSTREG_CUDA_SYMBOLS(CHECK, CHECK)
#pragma once

#include <cstddef>
#include <type_traits>

namespace hrabi {

template <class A, class B>
struct same;

template <class T>
constexpr bool scalar = std::is_integral_v<T> || std::is_enum_v<T>;

template <class A, class B>
constexpr bool same_value() {
    if constexpr (std::is_void_v<A> || std::is_void_v<B>) {
        return std::is_void_v<A> && std::is_void_v<B>;
    } else if constexpr (scalar<A> && scalar<B>) {
        return sizeof(A) == sizeof(B);
    } else if constexpr (std::is_pointer_v<A> && std::is_pointer_v<B>) {
        using PA = std::remove_pointer_t<A>;
        using PB = std::remove_pointer_t<B>;
        if constexpr (std::is_const_v<PA> != std::is_const_v<PB>) {
            return false;
        } else if constexpr (std::is_class_v<std::remove_cv_t<PA>> && std::is_class_v<std::remove_cv_t<PB>>) {
            return true;  // opaque handles and structs: pointers to records
        } else {
            return same_value<std::remove_cv_t<PA>, std::remove_cv_t<PB>>();
        }
    } else if constexpr (std::is_class_v<A> && std::is_class_v<B>) {
        return sizeof(A) == sizeof(B) && alignof(A) == alignof(B);
    } else {
        return false;
    }
}

template <class A, class B>
struct fn_same : std::false_type {};
template <class RA, class... A, class RB, class... B>
struct fn_same<RA (*)(A...), RB (*)(B...)> {
    static constexpr bool value = sizeof...(A) == sizeof...(B) && same_value<RA, RB>() && (same_value<A, B>() && ...);
};
template <class RA, class... A, class RB, class... B>
struct fn_same<RA (*)(A...), RB (*)(B...) noexcept> : fn_same<RA (*)(A...), RB (*)(B...)> {};

template <class A, class B>
constexpr bool same_fn = fn_same<A, B>::value;

}  // namespace hrabi

// Every symbol of a list, checked against the global declaration of the same name.
#define HRABI_CHECK_FN(name, ret, args) \
    static_assert(hrabi::same_fn<ret(*) args, decltype(&::name)>, "hostreg's type of " #name " is not the header's");
