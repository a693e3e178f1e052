// librdmadev_plugin.so: the file setup.py puts in site-packages/tensorflow-plugins/, which
// `import tensorflow` loads into every TF process (tensorflow/__init__.py) and which must
// therefore never make that import fail, never start anything, and cost nothing measurable.
//
// It links nothing of TensorFlow: a loader that did would fail to load (and take
// `import tensorflow` down with it) the day TF no longer exports a symbol it needs. Instead,
// when it is loaded it
//   1. does nothing if RDMADEV_PLUGIN=0;
//   2. checks that the running TF is the one rdmadev was built against (TF_Version(), found in
//      the already loaded libtensorflow_cc.so.2); another version: one warning, nothing loaded;
//   3. dlopen()s rdmadev's protocol library (_tf_protocol.so, protocol.cc), whose static
//      registrar registers the "grpc+rdmadev" ServerFactory. That library starts nothing
//      either: rdmadev's runtime comes up only when a server is created with that protocol.
// Any failure is one line on stderr naming the fix; `import tensorflow` goes on.
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

// Set by setup.py: the TF version the protocol library was compiled against, and the rdmadev
// package folder of an in-place (editable) build; empty in a wheel, whose package is found
// next to this file's own folder (site-packages/rdmadev) and nowhere else: a wheel built in a
// temporary folder must not look there once installed (anyone may create it again).
#ifndef RDMADEV_BUILT_TF_VERSION
#error "setup.py defines RDMADEV_BUILT_TF_VERSION"
#endif
#ifndef RDMADEV_PACKAGE_DIR
#error "setup.py defines RDMADEV_PACKAGE_DIR"
#endif

namespace {

constexpr const char* kProtocolLibrary = "_tf_protocol.so";
constexpr const char* kSwitch = "RDMADEV_PLUGIN";

void Warn(const std::string& what) {
  fprintf(stderr, "rdmadev: TF plugin left inactive: %s (set %s=0 to silence this)\n",
          what.c_str(), kSwitch);
}

// The running TensorFlow's version, or "" if it cannot be told (TF_Version is in the C API of
// libtensorflow_cc.so.2, which _pywrap_tensorflow_internal loaded before any plugin).
std::string RunningTfVersion() {
  void* cc = dlopen("libtensorflow_cc.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (cc == nullptr) return "";
  auto version = reinterpret_cast<const char* (*)()>(dlsym(cc, "TF_Version"));
  std::string out = version != nullptr ? version() : "";
  dlclose(cc);  // drops the reference RTLD_NOLOAD took; TF stays loaded
  return out;
}

bool Exists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// Where rdmadev's protocol library is: site-packages/rdmadev/ beside this file's folder
// (installed wheel), else the in-place build's package folder, if this is an in-place build.
std::string ProtocolLibraryPath() {
  const std::string tree = RDMADEV_PACKAGE_DIR;
  std::string beside;
  Dl_info self;
  if (dladdr(reinterpret_cast<void*>(&ProtocolLibraryPath), &self) != 0 && self.dli_fname) {
    char real[PATH_MAX];
    if (realpath(self.dli_fname, real) != nullptr) {
      std::string dir(real);
      dir = dir.substr(0, dir.rfind('/'));              // .../tensorflow-plugins
      dir = dir.substr(0, dir.rfind('/')) + "/rdmadev";  // .../site-packages/rdmadev
      beside = dir + "/" + kProtocolLibrary;
    }
  }
  if (tree.empty() || (!beside.empty() && Exists(beside))) return beside;
  return tree + "/" + kProtocolLibrary;
}

__attribute__((constructor)) void LoadRdmadevProtocol() {
  const char* on = getenv(kSwitch);
  if (on != nullptr && strcmp(on, "0") == 0) return;
  std::string running = RunningTfVersion();
  if (running != RDMADEV_BUILT_TF_VERSION) {
    Warn("rdmadev was built against TensorFlow " RDMADEV_BUILT_TF_VERSION ", this is " +
         (running.empty() ? std::string("an unknown version") : running) +
         "; rebuild it (pip install --force-reinstall --no-deps rdmadev, or -e . in its tree)");
    return;
  }
  std::string path = ProtocolLibraryPath();
  if (!Exists(path)) {
    Warn("rdmadev is not installed at " + path + " any more; reinstall it, or delete this "
         "plugin from site-packages/tensorflow-plugins/");
    return;
  }
  // RTLD_LOCAL: nothing of rdmadev's becomes visible to other libraries. The library stays
  // loaded for the life of the process (its factory is in TF's registry).
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* why = dlerror();
    Warn("cannot load " + path + ": " + (why != nullptr ? why : "unknown error"));
  }
}

}  // namespace
