// Loader for tuner plugins (plugins/tuner/loom_tuner_v1.h) via dlopen.
#pragma once

#include <memory>
#include <string>

#include "loom/status.h"
#include "../../plugins/tuner/loom_tuner_v1.h"  // the C ABI; relative so includers need no extra -I

namespace loom::topo {

class TunerPlugin {
 public:
  // Opens `path`, checks the ABI version and struct size, calls init().
  // Every failure is a kInvalidArgument/kSystemError naming the path.
  static Result<std::unique_ptr<TunerPlugin>> load(const std::string& path, int nranks, int nhosts);
  ~TunerPlugin();
  TunerPlugin(const TunerPlugin&) = delete;
  TunerPlugin& operator=(const TunerPlugin&) = delete;

  const std::string& name() const { return name_; }
  Result<loom_tuner_choice_v1_t> choose(const loom_tuner_request_v1_t& request);

 private:
  TunerPlugin() = default;
  void* handle_ = nullptr;
  const loom_tuner_v1_t* api_ = nullptr;
  void* context_ = nullptr;
  std::string name_;
};

}  // namespace loom::topo
