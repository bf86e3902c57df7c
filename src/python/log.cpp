// log.cpp: integer arguments as the Python package documents them, and hostreg's diagnostics
// sent to a Python callable (see common.hpp for the extension's files).
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "common.hpp"
#include "hostreg/hostreg.h"

namespace hostreg_py {

uint64_t int_arg(nb::handle value, const char* name, unsigned long long limit) {
    if (PyBool_Check(value.ptr())) throw nb::type_error((std::string(name) + " must be an int, not bool").c_str());
    PyObject* index = PyNumber_Index(value.ptr());
    if (!index) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw nb::python_error();  // e.g. a Ctrl-C in __index__
        PyErr_Clear();
        throw nb::type_error((std::string(name) + " must be an int, not " + Py_TYPE(value.ptr())->tp_name).c_str());
    }
    nb::object i = nb::steal(index);
    int overflow = 0;
    const long long small = PyLong_AsLongLongAndOverflow(index, &overflow);
    unsigned long long v = static_cast<unsigned long long>(small);
    bool ok = overflow == 0 && small >= 0;
    if (overflow > 0) {  // above LLONG_MAX: may still fit 64 bits
        v = PyLong_AsUnsignedLongLong(index);
        ok = !PyErr_Occurred();
        PyErr_Clear();
    }
    // limit ~0ull stands for 2**64: every unsigned 64-bit value is below it.
    if (!ok || (limit != ~0ull && v >= limit)) {
        const std::string bound = limit == ~0ull ? "18446744073709551616" : std::to_string(limit);
        throw nb::value_error(
            (std::string(name) + " must be in [0, " + bound + "), got " + nb::str(i).c_str()).c_str());
    }
    return v;
}

std::atomic<bool> g_exiting{false};

bool interpreter_running() { return Py_IsInitialized() && !g_exiting.load(std::memory_order_acquire); }

thread_local const char* t_label = nullptr;

namespace {

// hostreg's diagnostics go to one Python callable, sink(level, call, code, native, message,
// label), set by hostreg/_core.py; each event reaches it once (hostregSetLogHandler). label:
// what host_register / host_unregister were called for (the drop-in names torch's call), else
// None. The sink is called with the GIL, on the thread of the event, in the middle of a C
// call: an exception cannot pass through C, so a KeyboardInterrupt raised there is kept for
// this thread and raised by the binding once the C call has returned (raise_pending); any
// other exception is reported as unraisable.
PyObject* g_log_sink = nullptr;              // a strong reference, kept until exit
thread_local PyObject* t_pending = nullptr;  // a KeyboardInterrupt the sink raised (take_error)

PyObject* text(const char* s) {  // hostreg's messages may quote bytes that are not UTF-8
    return PyUnicode_DecodeUTF8(s, static_cast<Py_ssize_t>(std::strlen(s)), "backslashreplace");
}

void to_sink(void*, int level, const char* call, int code, long long native, const char* message) {
    if (!interpreter_running()) return;
    PyGILState_STATE g = PyGILState_Ensure();
    if (PyObject* sink = g_log_sink) {
        Py_INCREF(sink);                // set_log_sink() may replace it while it runs
        PyObject* held = take_error();  // an exception being raised stays as it was
        PyObject* args = Py_BuildValue("(isiLNN)", level, call, code, native, text(message),
                                       t_label ? text(t_label) : (Py_INCREF(Py_None), Py_None));
        PyObject* r = args ? PyObject_Call(sink, args, nullptr) : nullptr;
        Py_XDECREF(args);
        if (r) {
            Py_DECREF(r);
        } else if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) && !t_pending) {
            t_pending = take_error();
        } else {
            PyErr_WriteUnraisable(sink);  // a failing logging handler must not fail the call
        }
        restore_error(held);
        Py_DECREF(sink);
    }
    PyGILState_Release(g);
}

}  // namespace

// After a C call, with the GIL: the KeyboardInterrupt the log sink raised during it, if any.
void raise_pending() {
    if (!t_pending) return;
    restore_error(t_pending);
    t_pending = nullptr;
    throw nb::python_error();
}

void bind_log(nb::module_& m) {
    m.def(
        "set_log_sink",
        [](nb::object sink) {
            if (!sink.is_none() && !PyCallable_Check(sink.ptr()))
                throw nb::type_error("the log sink must be callable or None");
            PyObject* old = g_log_sink;
            g_log_sink = sink.is_none() ? nullptr : sink.release().ptr();
            hostregSetLogHandler(g_log_sink ? to_sink : nullptr, nullptr);
            Py_XDECREF(old);
        },
        nb::arg("sink").none(),
        "Send hostreg's diagnostics to sink(level, call, code, native, message, label) (0 debug, 1 info, "
        "2 warning); None: back to stderr (HOSTREG_LOG_LEVEL).");
    m.def(
        "format_log_event",
        [](const std::string& call, int code, long long native, const std::string& message) {
            std::string out(hostregFormatLogEvent(call.c_str(), code, native, message.c_str(), nullptr, 0), '\0');
            hostregFormatLogEvent(call.c_str(), code, native, message.c_str(), out.data(), out.size() + 1);
            return out;
        },
        nb::arg("call"), nb::arg("code"), nb::arg("native"), nb::arg("message"),
        "hostregFormatLogEvent: one event in hostreg's log format.");
    m.def("log_level_from_environment", &hostregLogLevelFromEnvironment,
          "hostregLogLevelFromEnvironment: HOSTREG_LOG_LEVEL as 0 debug, 1 info, 2 warning, or -1.");
    m.def("version", &hostregVersion, "Version of the C library.");
}

}  // namespace hostreg_py
