// The "grpc+rdmadev" server protocol: a TensorFlow ServerFactory (TF picks the server
// implementation of a ServerDef by asking each registered factory whether it accepts it), so
// `tf.distribute.Server(..., protocol="grpc+rdmadev")`, `tf.compat.v1.train.Server`,
// `tf.config.experimental_connect_to_cluster(..., protocol=...)` and cluster resolvers with
// that rpc_layer start rdmadev with TF's server, in scripts that never import rdmadev.
//
// NewServer first brings up the task's rdmadev runtime (rdmadev.tf.protocol.start_task, in
// this process's Python: Domain, control service, the op library and the partition pass,
// rewriting whatever this process partitions), then hands the ServerDef with protocol "grpc"
// to TF's own gRPC factory. The server returned is TF's own: TF's eager runtime accepts no
// other class (it dynamic_casts to GrpcServer), and grpc_server_lib.h cannot be compiled
// against the wheel anyway (it needs grpcpp headers the wheel does not ship).
//
// Loaded by the plugin loader (plugin_loader.cc) at `import tensorflow`, or by
// rdmadev.tf.protocol.load(). Registering the factory is all loading does.
#define PY_SSIZE_T_CLEAN  // "y#" takes a Py_ssize_t length
#include <Python.h>

#include <memory>
#include <string>

#include "tensorflow/core/distributed_runtime/server_lib.h"
#include "tensorflow/core/protobuf/tensorflow_server.pb.h"

namespace rdmadev_tf {
namespace {

constexpr const char* kProtocol = "grpc+rdmadev";
constexpr const char* kDelegate = "grpc";  // TF's own gRPC server does the serving
constexpr const char* kStartModule = "rdmadev.tf.protocol";

// The pending Python exception as text (and cleared).
std::string TakePythonError() {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  std::string out = "unknown Python error";
  PyObject* text = value != nullptr ? PyObject_Str(value) : nullptr;
  if (text != nullptr && PyUnicode_Check(text)) out = PyUnicode_AsUTF8(text);
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  PyErr_Clear();
  return out;
}

// rdmadev.tf.protocol.start_task(server_def bytes): None when this task's rdmadev runtime is
// up, else the error message (with its fix) to fail the server's creation with.
absl::Status StartRdmadev(const tensorflow::ServerDef& def) {
  if (!Py_IsInitialized()) {
    return absl::FailedPreconditionError(
        std::string("the ") + kProtocol + " protocol needs a Python process (rdmadev's runtime "
        "runs in Python); start this task from Python, or use protocol \"grpc\"");
  }
  const std::string bytes = def.SerializeAsString();
  PyGILState_STATE gil = PyGILState_Ensure();  // whether or not the caller released the GIL
  std::string error;
  PyObject* module = PyImport_ImportModule(kStartModule);
  PyObject* result = module == nullptr ? nullptr
      : PyObject_CallMethod(module, "start_task", "y#", bytes.data(),
                            static_cast<Py_ssize_t>(bytes.size()));
  if (result == nullptr) {
    error = "rdmadev could not start (" + std::string(kStartModule) + "): " + TakePythonError();
  } else if (result != Py_None) {
    const char* text = PyUnicode_Check(result) ? PyUnicode_AsUTF8(result) : nullptr;
    error = text != nullptr ? text : "rdmadev could not start";
  }
  Py_XDECREF(result);
  Py_XDECREF(module);
  PyGILState_Release(gil);
  if (!error.empty()) return absl::InvalidArgumentError(error);
  return absl::OkStatus();
}

class RdmadevServerFactory : public tensorflow::ServerFactory {
 public:
  bool AcceptsOptions(const tensorflow::ServerDef& def) override {
    return def.protocol() == kProtocol;
  }

  absl::Status NewServer(const tensorflow::ServerDef& def, const Options& options,
                         std::unique_ptr<tensorflow::ServerInterface>* out) override {
    absl::Status started = StartRdmadev(def);
    if (!started.ok()) return started;
    tensorflow::ServerDef grpc_def = def;
    grpc_def.set_protocol(kDelegate);
    tensorflow::ServerFactory* grpc = nullptr;
    absl::Status found = tensorflow::ServerFactory::GetFactory(grpc_def, &grpc);
    if (!found.ok()) return found;
    return grpc->NewServer(grpc_def, options, out);
  }
};

// A process can load two copies of this library: a virtualenv that also sees the system's
// site-packages has two tensorflow-plugins/ folders, each with a loader of its own rdmadev.
// The first copy registers; the factory only calls into this process's rdmadev Python
// package, so either copy serves. (TF would log an error for a second registration.)
struct Registrar {
  Registrar() {
    tensorflow::ServerDef probe;
    probe.set_protocol(kProtocol);
    tensorflow::ServerFactory* registered = nullptr;
    if (tensorflow::ServerFactory::GetFactory(probe, &registered).ok()) return;
    tensorflow::ServerFactory::Register("RDMADEV_SERVER", new RdmadevServerFactory());
  }
};
const Registrar registrar;

}  // namespace
}  // namespace rdmadev_tf
