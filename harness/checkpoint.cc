#include "harness/checkpoint.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

namespace loom::harness {

namespace {
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'G', 'P', 'T', '1'};

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;
}  // namespace

Status save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  if (ckpt.params.size() != full_param_count(ckpt.config))
    return invalid_argument("checkpoint: parameter count does not match the model shape");
  // Write to a temporary name and rename, so a crash never leaves half a file.
  const std::string tmp = path + ".tmp";
  // A failed save removes its temporary file. Regression: it was left
  // behind (Checkpoint.AFailedSaveLeavesNoTemporaryFile).
  auto fail = [&](const std::string& what, int err) {
    std::remove(tmp.c_str());
    return system_error(what, err);
  };
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) return system_error("checkpoint: cannot create " + tmp, errno);
    const ModelConfig& c = ckpt.config;
    const int32_t hdr[6] = {c.vocab, c.ctx, c.layers, c.dim, c.heads, ckpt.step};
    const int64_t count = static_cast<int64_t>(ckpt.params.size());
    bool ok = std::fwrite(kMagic, 1, sizeof kMagic, f.get()) == sizeof kMagic &&
              std::fwrite(hdr, sizeof hdr, 1, f.get()) == 1 &&
              std::fwrite(&count, sizeof count, 1, f.get()) == 1 &&
              std::fwrite(ckpt.params.data(), sizeof(float), ckpt.params.size(), f.get()) == ckpt.params.size();
    ok = ok && std::fflush(f.get()) == 0;
    if (!ok) {
      const int err = errno;
      f.reset();
      return fail("checkpoint: write to " + tmp + " failed", err);
    }
    if (std::fclose(f.release()) != 0) return fail("checkpoint: closing " + tmp + " failed", errno);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("checkpoint: rename to " + path + " failed", errno);
  return Status::ok();
}

Result<Checkpoint> load_checkpoint(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return system_error("checkpoint: cannot open " + path, errno);
  char magic[8];
  int32_t hdr[6];
  int64_t count = 0;
  if (std::fread(magic, 1, sizeof magic, f.get()) != sizeof magic || std::memcmp(magic, kMagic, 8) != 0)
    return invalid_argument("checkpoint: " + path + " is not a Loom harness checkpoint");
  if (std::fread(hdr, sizeof hdr, 1, f.get()) != 1 || std::fread(&count, sizeof count, 1, f.get()) != 1)
    return invalid_argument("checkpoint: " + path + " is truncated (header)");
  Checkpoint ck;
  ck.config = {hdr[0], hdr[1], hdr[2], hdr[3], hdr[4]};
  ck.step = hdr[5];
  LOOM_RETURN_IF_ERROR(ck.config.validate().with_context("checkpoint " + path));
  if (count < 0 || static_cast<size_t>(count) != full_param_count(ck.config))
    return invalid_argument("checkpoint: " + path + " holds " + std::to_string(count) +
                            " values, the model shape needs " + std::to_string(full_param_count(ck.config)));
  // The file must hold the values its header promises before they are
  // allocated. Regression: a header claiming a huge model threw bad_alloc
  // (std::terminate) instead of being refused (Checkpoint.AHeaderPromising
  // MoreThanTheFileHoldsIsRefused).
  const long here = std::ftell(f.get());
  if (here < 0 || std::fseek(f.get(), 0, SEEK_END) != 0) return system_error("checkpoint: cannot seek " + path, errno);
  const long end = std::ftell(f.get());
  if (end < here || static_cast<uint64_t>(end - here) < static_cast<uint64_t>(count) * sizeof(float))
    return invalid_argument("checkpoint: " + path + " is truncated (weights: the header promises " +
                            std::to_string(count) + " values, the file holds " +
                            std::to_string(end < here ? 0 : (end - here) / 4) + ")");
  if (std::fseek(f.get(), here, SEEK_SET) != 0) return system_error("checkpoint: cannot seek " + path, errno);
  ck.params.resize(static_cast<size_t>(count));
  if (std::fread(ck.params.data(), sizeof(float), ck.params.size(), f.get()) != ck.params.size())
    return invalid_argument("checkpoint: " + path + " is truncated (weights)");
  return ck;
}

}  // namespace loom::harness
