// ext.cpp: the module hostreg._hostreg (nanobind). Its calls are bound by the files
// common.hpp lists; this one sets the module up.
#include <atomic>

#include "common.hpp"

NB_MODULE(_hostreg, m) {
    using namespace hostreg_py;
    m.doc() = "hostreg's C core. Use the hostreg package rather than this module.";
    // Staged tensors may outlive the module at interpreter exit (they hold their buffers);
    // the OS releases the memory, and nanobind's leak report would only alarm.
    nb::set_leak_warnings(false);
    // atexit callbacks run in reverse order: those registered later (modules imported after
    // hostreg) run before this one and may still release buffers; what callbacks registered
    // earlier free afterwards is left to the OS.
    nb::module_::import_("atexit").attr("register")(
        nb::cpp_function([]() { g_exiting.store(true, std::memory_order_release); }));
    bind_log(m);
    bind_registration(m);
    bind_staging(m);
    bind_io(m);
    bind_batch(m);
}
