// The few pieces of glue between the C++ core and CPython that are clearer in C++:
// turning core errors into rdmadev's Python exceptions, and Python callables into
// progress callbacks that take the GIL.
#pragma once

#include <Python.h>

#include <memory>
#include <new>

#include "completion.h"
#include "fabric.h"

namespace rdmadev_py {

// rdmadev.errors._from_native(kind, errno, message, hint) -> exception instance, looked up
// on first use. Every extension module has its own copy of this static (each is its own
// shared object), so no module has to register anything at import. Called with the GIL held.
inline PyObject* ErrorFactory() {
  static PyObject* factory = nullptr;
  if (!factory) {
    PyObject* mod = PyImport_ImportModule("rdmadev.errors");
    if (mod) {
      factory = PyObject_GetAttrString(mod, "_from_native");
      Py_DECREF(mod);
    }
    if (!factory) PyErr_Clear();
  }
  return factory;
}

// Cython's `except +raise_py_error` calls this inside the catch block.
inline void raise_py_error() {
  try {
    throw;
  } catch (const rdmadev::Error& e) {
    PyObject* exc = ErrorFactory()
                        ? PyObject_CallFunction(ErrorFactory(), "iiss", static_cast<int>(e.kind()),
                                                e.err(), e.what(), e.hint().c_str())
                        : nullptr;
    if (exc) {
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
      Py_DECREF(exc);
    } else if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception in rdmadev");
  }
}

// callback(ok: bool, value: int, kind: int, message: str), run on the progress thread.
inline rdmadev::Progress::Callback PyProgressCallback(PyObject* fn) {
  Py_INCREF(fn);
  std::shared_ptr<PyObject> holder(fn, [](PyObject* o) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE s = PyGILState_Ensure();
    Py_DECREF(o);
    PyGILState_Release(s);
  });
  return [holder](const rdmadev::Status& st, uint64_t value) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE s = PyGILState_Ensure();
    PyObject* r = PyObject_CallFunction(holder.get(), "OKis", st.ok ? Py_True : Py_False,
                                        static_cast<unsigned long long>(value),
                                        static_cast<int>(st.kind), st.message.c_str());
    if (r) {
      Py_DECREF(r);
    } else {
      PyErr_WriteUnraisable(holder.get());  // never lose an exception silently
    }
    PyGILState_Release(s);
  };
}

inline rdmadev::Liveness AliveOf(const std::shared_ptr<rdmadev::Endpoint>& ep) {
  if (!ep) return nullptr;
  return [ep](std::string* why) { return ep->Alive(why); };
}

}  // namespace rdmadev_py
