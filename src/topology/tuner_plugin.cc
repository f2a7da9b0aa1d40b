#include "topology/tuner_plugin.h"

#include <dlfcn.h>

namespace loom::topo {

Result<std::unique_ptr<TunerPlugin>> TunerPlugin::load(const std::string& path, int nranks, int nhosts) {
  std::unique_ptr<TunerPlugin> p(new TunerPlugin());
  p->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (p->handle_ == nullptr) {
    const char* e = dlerror();
    return invalid_argument("tuner plugin '" + path + "': dlopen failed: " + (e != nullptr ? e : "unknown error"));
  }
  dlerror();
  void* sym = dlsym(p->handle_, LOOM_TUNER_SYMBOL_V1);
  if (sym == nullptr) {
    return invalid_argument("tuner plugin '" + path + "' does not export " LOOM_TUNER_SYMBOL_V1);
  }
  const auto* api = static_cast<const loom_tuner_v1_t*>(sym);
  if (api->abi_version != LOOM_TUNER_ABI_VERSION_1) {
    return invalid_argument("tuner plugin '" + path + "' has ABI version " + std::to_string(api->abi_version) +
                            ", this Loom speaks version 1");
  }
  if (api->struct_size < sizeof(loom_tuner_v1_t) || api->init == nullptr || api->choose == nullptr ||
      api->finalize == nullptr) {
    return invalid_argument("tuner plugin '" + path + "': incomplete loom_tuner_v1_t (size or function missing)");
  }
  p->api_ = api;
  p->name_ = api->name != nullptr ? api->name : path;
  int rc = api->init(&p->context_, nranks, nhosts);
  if (rc != 0) {
    p->api_ = nullptr;  // do not finalize what failed to init
    return invalid_argument("tuner plugin '" + p->name_ + "': init returned " + std::to_string(rc));
  }
  return p;
}

TunerPlugin::~TunerPlugin() {
  if (api_ != nullptr) api_->finalize(context_);
  if (handle_ != nullptr) dlclose(handle_);
}

Result<loom_tuner_choice_v1_t> TunerPlugin::choose(const loom_tuner_request_v1_t& request) {
  loom_tuner_choice_v1_t c{-1, 0, 0};
  int rc = api_->choose(context_, &request, &c);
  if (rc != 0) return internal_error("tuner plugin '" + name_ + "': choose returned " + std::to_string(rc));
  if (c.candidate < -1 || c.candidate >= request.num_candidates) {
    return internal_error("tuner plugin '" + name_ + "': candidate " + std::to_string(c.candidate) + " out of range");
  }
  if (c.channels < 0 || c.channels > 1024) {
    return internal_error("tuner plugin '" + name_ + "': channel count " + std::to_string(c.channels) + " out of range");
  }
  return c;
}

}  // namespace loom::topo
