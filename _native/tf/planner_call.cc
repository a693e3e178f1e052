// planner_call.h: the pass's call into rdmadev.tf.bridge (CPython's C API, GIL held).
#include <Python.h>

#include "planner_call.h"

namespace rdmadev_tf {
namespace {

// The pending Python exception's text; clears it.
std::string PyErrorText() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  std::string text = "unknown Python error";
  if (value) {
    PyObject* s = PyObject_Str(value);
    if (s) {
      const char* c = PyUnicode_AsUTF8(s);
      if (c) text = c;
      Py_DECREF(s);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return text;
}

// The ints of the Python sequence `seq` (a shape); false with a Python error set if it is none.
bool Dims(PyObject* seq, std::vector<int64_t>* out) {
  const Py_ssize_t n = PySequence_Size(seq);
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* d = PySequence_GetItem(seq, j);
    out->push_back(d ? PyLong_AsLongLong(d) : -1);
    Py_XDECREF(d);
  }
  return n >= 0 && !PyErr_Occurred();
}

}  // namespace

bool CallPlanner(const std::map<std::string, std::string>& parts, const std::string& function,
                 const std::vector<std::string>& marked, std::vector<Rewrite>* out,
                 std::string* error) {
  if (!Py_IsInitialized()) {
    *error = "no Python interpreter in this process";
    return false;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  bool ok = false;
  PyObject* mod = PyImport_ImportModule("rdmadev.tf.bridge");
  PyObject* arg = PyDict_New();
  PyObject* names = PyList_New(0);
  PyObject* res = nullptr;
  if (mod && arg && names) {
    for (const auto& name : marked) {
      PyObject* v = PyUnicode_FromString(name.c_str());
      PyList_Append(names, v);
      Py_XDECREF(v);
    }
    for (const auto& kv : parts) {
      PyObject* v = PyBytes_FromStringAndSize(kv.second.data(), kv.second.size());
      PyDict_SetItemString(arg, kv.first.c_str(), v);
      Py_XDECREF(v);
    }
    res = PyObject_CallMethod(mod, "rewrites", "OsO", arg, function.c_str(), names);
  }
  if (res && PyList_Check(res)) {
    ok = true;
    for (Py_ssize_t i = 0; i < PyList_Size(res) && ok; ++i) {
      PyObject* t = PyList_GetItem(res, i);
      const char *kind, *device, *node, *channel;
      int dtype, zero_copy, owned, dead, loop;
      double timeout_s;
      PyObject *shape, *members;
      long long max_bytes, zero_copy_min_bytes;
      if (!PyArg_ParseTuple(t, "ssssiOpLdLpppO", &kind, &device, &node, &channel, &dtype, &shape,
                            &zero_copy, &zero_copy_min_bytes, &timeout_s, &max_bytes, &owned,
                            &dead, &loop, &members)) {
        ok = false;
        break;
      }
      Rewrite r{kind, device, node, channel, dtype, {}, shape == Py_None, zero_copy != 0,
                zero_copy_min_bytes, timeout_s, max_bytes, owned != 0, dead != 0, loop != 0, {}};
      if (!r.unknown_rank) ok = Dims(shape, &r.shape);
      ok = ok && PySequence_Check(members);
      for (Py_ssize_t j = 0; ok && j < PySequence_Size(members); ++j) {
        PyObject* m = PySequence_GetItem(members, j);
        const char* member_node;
        PyObject* member_shape;
        BundleMember b;
        long long offset = 0;
        ok = m && PyArg_ParseTuple(m, "siOL", &member_node, &b.dtype, &member_shape, &offset) &&
             Dims(member_shape, &b.shape);
        if (ok) {
          b.node = member_node;
          b.offset = offset;
          r.members.push_back(std::move(b));
        }
        Py_XDECREF(m);
      }
      if (!ok) break;
      out->push_back(std::move(r));
    }
  }
  if (!ok) *error = PyErr_Occurred() ? PyErrorText() : "rdmadev.tf.bridge.rewrites returned no list";
  Py_XDECREF(res);
  Py_XDECREF(names);
  Py_XDECREF(arg);
  Py_XDECREF(mod);
  PyGILState_Release(gil);
  return ok;
}

}  // namespace rdmadev_tf
