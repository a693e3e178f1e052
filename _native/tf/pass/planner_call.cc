// planner_call.h: the pass's call into rdmadev.tf.bridge and the reading of the PassView it
// returns (CPython's C API, GIL held), field by field, by name.
#include <Python.h>

#include "planner_call.h"

#include <cstring>

#include "tensorflow/core/framework/types.pb.h"

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

// Owns one reference.
class Ref {
 public:
  explicit Ref(PyObject* p = nullptr) : p_(p) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(p_); }
  PyObject* get() const { return p_; }

 private:
  PyObject* p_;
};

// Reads the fields of the view's Python objects, each at a path ("halves[2].decision"): the
// first that is missing or of another type is the error, named by its path.
class Reader {
 public:
  explicit Reader(std::string* error) : error_(error) {}

  // A new reference to field `name` of `obj`, or null with the error set.
  PyObject* Field(PyObject* obj, const std::string& path, const char* name) {
    PyObject* v = PyObject_GetAttrString(obj, name);
    if (!v) {
      const bool missing = PyErr_ExceptionMatches(PyExc_AttributeError);
      const std::string text = PyErrorText();
      Fail(path + " (" + TypeName(obj) + ") has no field '" + name + "'" +
           (missing ? "" : ": reading it raised " + text));
    }
    return v;
  }

  bool Str(PyObject* obj, const std::string& path, const char* name, std::string* out) {
    Ref v(Field(obj, path, name));
    if (!v.get()) return false;
    const char* c = PyUnicode_Check(v.get()) ? PyUnicode_AsUTF8(v.get()) : nullptr;
    if (!c) return Wrong(path, name, v.get(), "str");
    *out = c;
    return true;
  }

  bool Bool(PyObject* obj, const std::string& path, const char* name, bool* out) {
    Ref v(Field(obj, path, name));
    if (!v.get()) return false;
    if (!PyBool_Check(v.get())) return Wrong(path, name, v.get(), "bool");
    *out = v.get() == Py_True;
    return true;
  }

  bool Int(PyObject* obj, const std::string& path, const char* name, int64_t* out) {
    Ref v(Field(obj, path, name));
    return v.get() && AsInt(v.get(), path + "." + name, out);
  }

  bool Float(PyObject* obj, const std::string& path, const char* name, double* out) {
    Ref v(Field(obj, path, name));
    if (!v.get()) return false;
    if (PyBool_Check(v.get()) || !(PyFloat_Check(v.get()) || PyLong_Check(v.get())))
      return Wrong(path, name, v.get(), "float");
    *out = PyFloat_AsDouble(v.get());
    if (PyErr_Occurred()) return Fail(path + "." + name + ": " + PyErrorText());
    return true;
  }

  // A field that is a tuple or list: a new reference to it, as a sequence, or null.
  PyObject* Sequence(PyObject* obj, const std::string& path, const char* name) {
    Ref v(Field(obj, path, name));
    if (!v.get()) return nullptr;
    if (!PyTuple_Check(v.get()) && !PyList_Check(v.get())) {
      Wrong(path, name, v.get(), "tuple");
      return nullptr;
    }
    Py_INCREF(v.get());
    return v.get();
  }

  // A shape: None (unknown rank) or a tuple/list of ints.
  bool Shape(PyObject* obj, const std::string& path, const char* name, std::vector<int64_t>* dims,
             bool* unknown_rank) {
    Ref v(Field(obj, path, name));
    if (!v.get()) return false;
    *unknown_rank = v.get() == Py_None;
    if (*unknown_rank) return true;
    if (!PyTuple_Check(v.get()) && !PyList_Check(v.get()))
      return Wrong(path, name, v.get(), "tuple of ints or None");
    const std::string at = path + "." + name;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v.get()); ++i) {
      int64_t d = 0;
      if (!AsInt(PySequence_Fast_GET_ITEM(v.get(), i), at + "[" + std::to_string(i) + "]", &d))
        return false;
      dims->push_back(d);
    }
    return true;
  }

  bool DataType(PyObject* obj, const std::string& path, const char* name, int* out) {
    std::string text;
    if (!Str(obj, path, name, &text)) return false;
    tensorflow::DataType dt;
    if (!tensorflow::DataType_Parse(text, &dt))
      return Fail(path + "." + name + " is '" + text + "', not a TensorFlow DataType name");
    *out = dt;
    return true;
  }

  bool Fail(const std::string& text) {
    if (error_->empty()) *error_ = text;
    return false;
  }

 private:
  static std::string TypeName(PyObject* o) { return Py_TYPE(o)->tp_name; }

  bool Wrong(const std::string& path, const char* name, PyObject* v, const char* expected) {
    return Fail(path + "." + name + " has type " + TypeName(v) + ", expected " + expected);
  }

  bool AsInt(PyObject* v, const std::string& at, int64_t* out) {
    if (PyBool_Check(v) || !PyLong_Check(v)) return Fail(at + " has type " + TypeName(v) + ", expected int");
    *out = PyLong_AsLongLong(v);
    if (PyErr_Occurred()) return Fail(at + ": " + PyErrorText());
    return true;
  }

  std::string* error_;
};

bool ReadSide(Reader& r, PyObject* obj, const std::string& path, bool* send) {
  std::string side;
  if (!r.Str(obj, path, "side", &side)) return false;
  if (side != "send" && side != "recv") return r.Fail(path + ".side is '" + side + "', expected 'send' or 'recv'");
  *send = side == "send";
  return true;
}

bool ReadFacts(Reader& r, PyObject* obj, const std::string& path, HalfFacts* f) {
  Ref facts(r.Field(obj, path, "facts"));
  const std::string at = path + ".facts";
  return facts.get() && r.Str(facts.get(), at, "node", &f->node) &&
         r.Str(facts.get(), at, "device", &f->device) && r.DataType(facts.get(), at, "dtype", &f->dtype) &&
         r.Shape(facts.get(), at, "shape", &f->shape, &f->unknown_rank);
}

bool ReadDecision(Reader& r, PyObject* obj, const std::string& path, HalfDecision* d) {
  Ref decision(r.Field(obj, path, "decision"));
  const std::string at = path + ".decision";
  return decision.get() && r.Str(decision.get(), at, "channel", &d->channel) &&
         r.Bool(decision.get(), at, "zero_copy", &d->zero_copy) &&
         r.Bool(decision.get(), at, "owned", &d->owned) && r.Bool(decision.get(), at, "dead", &d->dead) &&
         r.Bool(decision.get(), at, "loop", &d->loop) && r.Str(decision.get(), at, "host", &d->host);
}

bool ReadLimits(Reader& r, PyObject* obj, const std::string& path, Limits* l) {
  Ref limits(r.Field(obj, path, "limits"));
  const std::string at = path + ".limits";
  return limits.get() && r.Float(limits.get(), at, "timeout_s", &l->timeout_s) &&
         r.Int(limits.get(), at, "zero_copy_min_bytes", &l->zero_copy_min_bytes) &&
         r.Int(limits.get(), at, "max_bytes", &l->max_bytes);
}

bool ReadHalf(Reader& r, PyObject* obj, const std::string& path, SwappedHalf* h) {
  return ReadSide(r, obj, path, &h->send) && ReadFacts(r, obj, path, &h->facts) &&
         ReadDecision(r, obj, path, &h->decision) && ReadLimits(r, obj, path, &h->limits);
}

bool ReadBundle(Reader& r, PyObject* obj, const std::string& path, BundleHalf* b) {
  if (!ReadSide(r, obj, path, &b->send) || !r.Str(obj, path, "device", &b->device) ||
      !r.Str(obj, path, "host", &b->host) ||
      !r.Str(obj, path, "channel", &b->channel) || !ReadLimits(r, obj, path, &b->limits))
    return false;
  Ref members(r.Sequence(obj, path, "members"));
  if (!members.get()) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(members.get()); ++i) {
    const std::string at = path + ".members[" + std::to_string(i) + "]";
    BundleMember m;
    PyObject* member = PySequence_Fast_GET_ITEM(members.get(), i);
    if (!ReadFacts(r, member, at, &m.facts) || !r.Int(member, at, "offset", &m.offset)) return false;
    b->members.push_back(std::move(m));
  }
  if (b->members.empty()) return r.Fail(path + ".members is empty");
  return true;
}

// Reads each item of the sequence field `name` of `view` with `read`.
template <typename T, typename Read>
bool ReadEach(Reader& r, PyObject* view, const char* name, std::vector<T>* out, Read read) {
  Ref items(r.Sequence(view, "view", name));
  if (!items.get()) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items.get()); ++i) {
    T item;
    if (!read(r, PySequence_Fast_GET_ITEM(items.get(), i), std::string(name) + "[" + std::to_string(i) + "]",
              &item))
      return false;
    out->push_back(std::move(item));
  }
  return true;
}

}  // namespace

bool ReadPassView(PyObject* view, PassView* out, std::string* error) {
  error->clear();
  Reader r(error);
  return ReadEach(r, view, "halves", &out->halves, ReadHalf) &&
         ReadEach(r, view, "bundles", &out->bundles, ReadBundle);
}

bool CallPlanner(const std::map<std::string, std::string>& parts, const std::string& function,
                 const std::vector<std::string>& marked, const std::string& task, PassView* out,
                 std::string* error) {
  if (!Py_IsInitialized()) {
    *error = "no Python interpreter in this process";
    return false;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
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
    res = PyObject_CallMethod(mod, "rewrites", "OsOs", arg, function.c_str(), names, task.c_str());
  }
  bool ok = false;
  if (!res) {
    *error = PyErr_Occurred() ? PyErrorText() : "rdmadev.tf.bridge.rewrites could not be called";
  } else if (!ReadPassView(res, out, error)) {
    *error = "rdmadev.tf.bridge.rewrites returned a view the pass cannot read: " + *error;
  } else {
    ok = true;
  }
  Py_XDECREF(res);
  Py_XDECREF(names);
  Py_XDECREF(arg);
  Py_XDECREF(mod);
  PyGILState_Release(gil);
  return ok;
}

}  // namespace rdmadev_tf

// For tests (tests/test_bridge.py, through ctypes.PyDLL, the GIL held): reads `view` as the
// pass would. Returns 0 with `*text` one line "<path>=<value>" per field read (the values as
// the pass holds them: a dtype as its enum), or 1 with `*text` the error. `*text` is malloc'd:
// free it with rdmadev_free (shapes.cc).
extern "C" int rdmadev_read_pass_view(PyObject* view, char** text) {
  using namespace rdmadev_tf;
  PassView v;
  std::string out;
  const bool ok = ReadPassView(view, &v, &out);
  if (ok) {
    auto dims = [](const HalfFacts& f) {
      if (f.unknown_rank) return std::string("None");
      std::string s = "(";
      for (int64_t d : f.shape) s += std::to_string(d) + ",";
      return s + ")";
    };
    auto facts = [&](const std::string& at, const HalfFacts& f) {
      return at + ".node=" + f.node + "\n" + at + ".device=" + f.device + "\n" + at + ".dtype=" +
             std::to_string(f.dtype) + "\n" + at + ".shape=" + dims(f) + "\n";
    };
    auto limits = [](const std::string& at, const Limits& l) {
      return at + ".timeout_s=" + std::to_string(l.timeout_s) + "\n" + at + ".zero_copy_min_bytes=" +
             std::to_string(l.zero_copy_min_bytes) + "\n" + at + ".max_bytes=" + std::to_string(l.max_bytes) + "\n";
    };
    for (size_t i = 0; i < v.halves.size(); ++i) {
      const SwappedHalf& h = v.halves[i];
      const std::string at = "halves[" + std::to_string(i) + "]";
      const HalfDecision& d = h.decision;
      out += at + ".side=" + (h.send ? "send" : "recv") + "\n" + facts(at + ".facts", h.facts) +
             at + ".decision.channel=" + d.channel + "\n" + at + ".decision.zero_copy=" +
             std::to_string(d.zero_copy) + "\n" + at + ".decision.owned=" + std::to_string(d.owned) +
             "\n" + at + ".decision.dead=" + std::to_string(d.dead) + "\n" + at +
             ".decision.loop=" + std::to_string(d.loop) + "\n" + at + ".decision.host=" + d.host + "\n" +
             limits(at + ".limits", h.limits);
    }
    for (size_t i = 0; i < v.bundles.size(); ++i) {
      const BundleHalf& b = v.bundles[i];
      const std::string at = "bundles[" + std::to_string(i) + "]";
      out += at + ".side=" + (b.send ? "send" : "recv") + "\n" + at + ".device=" + b.device + "\n" + at + ".host=" + b.host + "\n" + at +
             ".channel=" + b.channel + "\n" + limits(at + ".limits", b.limits);
      for (size_t j = 0; j < b.members.size(); ++j) {
        const std::string m = at + ".members[" + std::to_string(j) + "]";
        out += facts(m + ".facts", b.members[j].facts) + m + ".offset=" + std::to_string(b.members[j].offset) + "\n";
      }
    }
  }
  *text = strdup(out.c_str());
  return ok ? 0 : 1;
}
