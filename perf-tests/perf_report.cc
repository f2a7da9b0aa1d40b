#include "perf_report.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace loom::perf {
namespace {

// nccl-tests' spelling of types in the table.
const char* type_label(DataType dt) {
  switch (dt) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "half";
    case DataType::kFloat32: return "float";
    case DataType::kFloat64: return "double";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFp8E4M3: return "f8e4m3";
    case DataType::kFp8E5M2: return "f8e5m2";
  }
  return "?";
}

// nccl-tests prints fewer decimals as times grow.
std::string time_text(double us) {
  char b[32];
  if (us >= 10000.0) snprintf(b, sizeof b, "%7.0f", us);
  else if (us >= 100.0) snprintf(b, sizeof b, "%7.1f", us);
  else snprintf(b, sizeof b, "%7.2f", us);
  return b;
}

double ratio(const Row& r) { return r.mpi.busbw > 0 ? r.out_of_place.busbw / r.mpi.busbw : 0; }

// A row's combination boundary: -d/-o/-r all run one sweep per combination.
bool same_combo(const Row& a, const Row& b) { return a.dt == b.dt && a.op == b.op && a.root == b.root; }

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) {
    fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace

const char* Report::op_label(const Row& r) const { return bench_reduces(info_.bench) ? redop_name(r.op) : "none"; }
int Report::root_label(const Row& r) const { return bench_rooted(info_.bench) ? r.root : -1; }

Report::Report(RunInfo info) : info_(std::move(info)) {
  table_ = !info_.opts.json_stdout && !info_.opts.csv_stdout;
}

void Report::begin(const std::vector<std::string>& extra) {
  if (!table_) return;
  const Options& o = info_.opts;
  printf("# Loom %s: %d ranks, bootstrap %s\n", bench_binary(info_.bench), info_.nranks, info_.bootstrap.c_str());
  if (o.sizes.empty()) {
    // The step as nccl-tests prints it: the factor, or whole bytes
    // (regression: %g printed 1 MiB as 1.04858e+06).
    const std::string step = o.factor > 0 ? fmt::format("{:g}(factor)", o.factor) : fmt::format("{}(bytes)", o.step);
    printf("# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d agg iters: %d "
           "validation: %d graph: 0\n",
           o.min_bytes, o.max_bytes, step.c_str(), o.warmup, o.iters, o.agg, o.check);
  } else {
    printf("# nThread 1 nGpus 0 sizes: %zu listed warmup iters: %d iters: %d agg iters: %d validation: %d graph: 0\n",
           o.sizes.size(), o.warmup, o.iters, o.agg, o.check);
  }
  // Loom waits for each op but, unlike nccl-tests -z 1, runs no barrier
  // after it (the time is the op's own); the header said it did.
  if (o.blocking) printf("# Blocking Enabled: wait for completion after each collective (no barrier)\n");
  if (o.fresh) printf("# Fresh inputs: the send buffer is rewritten before every operation (untimed)\n");
  if (o.local_register)
    printf("# Buffers: loom::mem_alloc (-R %d): peers map them and read them without process_vm_readv\n",
           o.local_register);
  for (const auto& n : o.notes) printf("# Note: %s\n", n.c_str());
  for (const auto& l : extra) printf("# %s\n", l.c_str());
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          %s\n", "", "", "",
         "", "", info_.opts.baseline_mpi ? "        MPI (out-of-place)" : "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  if (o.baseline_mpi) printf("  %7s  %6s  %6s  %8s", "time", "algbw", "busbw", "loom/mpi");
  printf("\n");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  if (o.baseline_mpi) printf("  %7s  %6s  %6s  %8s", "(us)", "(GB/s)", "(GB/s)", "(busbw)");
  printf("\n");
  fflush(stdout);
}

void Report::print_row(const Row& r) {
  const Options& o = info_.opts;
  printf("%12zu  %12zu  %8s  %6s  %6d", r.size_bytes, r.count, type_label(r.dt), op_label(r), root_label(r));
  for (const Measure* m : {&r.out_of_place, &r.in_place}) {
    if (m->wrong >= 0) printf("  %7s  %6.2f  %6.2f  %5.0f", time_text(m->time_us).c_str(), m->algbw, m->busbw, m->wrong);
    else printf("  %7s  %6.2f  %6.2f  %5s", time_text(m->time_us).c_str(), m->algbw, m->busbw, "N/A");
  }
  if (o.baseline_mpi) {
    if (r.has_mpi)
      printf("  %7s  %6.2f  %6.2f  %8.2f", time_text(r.mpi.time_us).c_str(), r.mpi.algbw, r.mpi.busbw, ratio(r));
    else
      printf("  %7s  %6s  %6s  %8s", "N/A", "N/A", "N/A", "N/A");
  }
  printf("\n");
  fflush(stdout);
}

void Report::add(const Row& row) {
  rows_.push_back(row);
  bw_sum_ += row.out_of_place.busbw + row.in_place.busbw;
  bw_count_ += 2;
  if (table_) print_row(row);
}

double Report::avg_busbw() const { return bw_count_ ? bw_sum_ / bw_count_ : 0.0; }

std::string Report::json_text(double wrong_total, double failed_tests) const {
  const Options& o = info_.opts;
  using nlohmann::json;
  auto measure = [](const Measure& m) {
    json j = {{"time_us", m.time_us}, {"algbw_gbps", m.algbw}, {"busbw_gbps", m.busbw}};
    j["wrong"] = m.wrong >= 0 ? json(m.wrong) : json(nullptr);
    return j;
  };
  json results = json::array();
  for (const Row& r : rows_) {
    json j = {{"size", r.size_bytes},
              {"count", r.count},
              {"datatype", type_label(r.dt)},
              {"redop", op_label(r)},
              {"root", root_label(r)},
              {"out_of_place", measure(r.out_of_place)},
              {"in_place", measure(r.in_place)}};
    if (r.has_mpi) {
      j["mpi"] = measure(r.mpi);
      j["loom_over_mpi_busbw"] = ratio(r);
    }
    results.push_back(j);
  }
  json doc = {{"benchmark", bench_binary(info_.bench)},
              {"collective", bench_name(info_.bench)},
              {"nranks", info_.nranks},
              {"host", info_.host},
              {"bootstrap", info_.bootstrap},
              {"algorithm", info_.algorithm},
              {"datatype", o.all_types ? json("all") : json(type_label(o.dt))},
              {"redop", !bench_reduces(info_.bench) ? json("none") : o.all_ops ? json("all") : json(redop_name(o.op))},
              {"root", !bench_rooted(info_.bench) ? json(-1) : o.all_roots ? json("all") : json(o.root)},
              {"iters", o.iters},
              {"warmup_iters", o.warmup},
              {"agg_iters", o.agg},
              {"average", static_cast<int>(o.average)},
              {"blocking", o.blocking},
              {"fresh", o.fresh},
              {"local_register", o.local_register},
              {"thp", o.thp},
              {"check", o.check},
              {"results", results},
              {"out_of_bounds", failed_tests},
              {"wrong_elements", wrong_total},
              {"avg_busbw_gbps", avg_busbw()}};
  if (!info_.mpi_library.empty()) doc["mpi_library"] = info_.mpi_library;
  return doc.dump(2) + "\n";
}

std::string Report::csv_text() const {
  std::string out =
      "collective,nranks,size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
      "ip_time_us,ip_algbw,ip_busbw,ip_wrong,mpi_time_us,mpi_algbw,mpi_busbw,loom_over_mpi\n";
  char line[512];
  for (const Row& r : rows_) {
    auto wrong = [](double w) { return w >= 0 ? std::to_string(static_cast<long long>(w)) : std::string(); };
    snprintf(line, sizeof line, "%s,%d,%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%s,%.3f,%.4f,%.4f,%s,", bench_name(info_.bench),
             info_.nranks, r.size_bytes, r.count, type_label(r.dt), op_label(r), root_label(r),
             r.out_of_place.time_us, r.out_of_place.algbw, r.out_of_place.busbw, wrong(r.out_of_place.wrong).c_str(),
             r.in_place.time_us, r.in_place.algbw, r.in_place.busbw, wrong(r.in_place.wrong).c_str());
    out += line;
    if (r.has_mpi) {
      snprintf(line, sizeof line, "%.3f,%.4f,%.4f,%.4f", r.mpi.time_us, r.mpi.algbw, r.mpi.busbw, ratio(r));
      out += line;
    } else {
      out += ",,,";
    }
    out += "\n";
  }
  return out;
}

bool Report::write_plot() const {
  const std::string& png = info_.opts.plot_file;
  std::string data = png + ".dat";
  std::string text = "# size oop_busbw ip_busbw mpi_busbw\n";
  char line[128];
  // One data block per combination (-d/-o/-r all run several), two blank
  // lines apart, so gnuplot can address each as `index k`.
  std::vector<std::string> combos;
  bool block_has_data = false;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    if (i == 0 || !same_combo(r, rows_[i - 1])) {
      if (i > 0) text += block_has_data ? "\n\n" : "1 NaN NaN NaN\n\n\n";  // keep the index count
      block_has_data = false;
      std::string label = type_label(r.dt);
      if (bench_reduces(info_.bench)) label += std::string(" ") + redop_name(r.op);
      if (bench_rooted(info_.bench)) label += " root " + std::to_string(r.root);
      combos.push_back(label);
    }
    if (r.size_bytes == 0) continue;  // log scale
    snprintf(line, sizeof line, "%zu %.4f %.4f %s\n", r.size_bytes, r.out_of_place.busbw, r.in_place.busbw,
             r.has_mpi ? std::to_string(r.mpi.busbw).c_str() : "NaN");
    text += line;
    block_has_data = true;
  }
  if (!write_file(data, text)) return false;
  std::string script = png + ".gp";
  std::string gp;
  gp += "set terminal png size 900,560 noenhanced\n";  // noenhanced: '_' in names is not a subscript
  gp += "set output '" + png + "'\n";
  gp += "set title 'Loom " + std::string(bench_binary(info_.bench)) + ", " + std::to_string(info_.nranks) +
        " ranks on " + info_.host + (combos.size() > 1 ? ", out-of-place" : "") + "'\n";
  gp += "set logscale x 2\nset format x '%.0b%B'\nset xlabel 'size (bytes)'\nset ylabel 'busbw (GB/s)'\n";
  gp += "set key top left\nset grid\n";
  if (combos.size() > 1) {
    // One line per combination, out of place (in place and MPI would double
    // or triple an already crowded plot; the table and --csv have them).
    gp += "plot";
    for (size_t k = 0; k < combos.size(); ++k)
      gp += std::string(k ? "," : "") + " '" + data + "' index " + std::to_string(k) +
            " using 1:2 with linespoints title '" + combos[k] + "'";
  } else {
    gp += "plot '" + data + "' using 1:2 with linespoints title 'Loom out-of-place', '" + data +
          "' using 1:3 with linespoints title 'Loom in-place'";
    if (info_.opts.baseline_mpi) gp += ", '" + data + "' using 1:4 with linespoints title 'MPI'";
  }
  gp += "\n";
  if (!write_file(script, gp)) return false;
  std::string cmd = "gnuplot '" + script + "'";
  int rc = std::system(cmd.c_str());
  std::remove(script.c_str());
  if (rc != 0) {
    fprintf(stderr, "gnuplot failed (%d); data left in %s\n", rc, data.c_str());
    return false;
  }
  std::remove(data.c_str());
  return true;
}

bool Report::finish(double wrong_total, double failed_tests, bool failed, bool* bw_ok) {
  const Options& o = info_.opts;
  // nccl-tests: NCCL_TESTS_MIN_BW (GB/s) fails a run whose average bus
  // bandwidth is below 90% of it, and says OK or FAILED after the figure.
  const char* min_env = std::getenv("NCCL_TESTS_MIN_BW");
  const double min_bw = min_env && *min_env ? std::atof(min_env) : -1;
  *bw_ok = failed || min_bw < 0 || avg_busbw() >= 0.9 * min_bw;
  if (table_ && !failed) {
    // nccl-tests counts the tests that failed (a row's out-of-place or
    // in-place check, once per rank that saw a wrong element), not the
    // elements: those are in the row's #wrong column.
    printf("# Out of bounds values : %.0f %s\n", failed_tests, wrong_total == 0 ? "OK" : "FAILED");
    printf("# Avg bus bandwidth    : %g %s\n", avg_busbw(), min_bw < 0 ? "" : *bw_ok ? "OK" : "FAILED");
    if (o.baseline_mpi) {
      double log_sum = 0;
      int k = 0;
      const Row* worst = nullptr;
      for (const Row& r : rows_) {
        if (!r.has_mpi || ratio(r) <= 0) continue;
        log_sum += std::log(ratio(r));
        ++k;
        if (!worst || ratio(r) < ratio(*worst)) worst = &r;
      }
      if (k > 0)
        printf("# Loom/MPI busbw (out-of-place): geometric mean %.2f, lowest %.2f at %zu B\n", std::exp(log_sum / k),
               ratio(*worst), worst->size_bytes);
    }
    printf("#\n");
    fflush(stdout);
  }
  bool ok = true;
  if (o.json_stdout) fputs(json_text(wrong_total, failed_tests).c_str(), stdout);
  if (o.csv_stdout) fputs(csv_text().c_str(), stdout);
  if (!o.json_file.empty()) ok = write_file(o.json_file, json_text(wrong_total, failed_tests)) && ok;
  if (!o.csv_file.empty()) ok = write_file(o.csv_file, csv_text()) && ok;
  if (!o.plot_file.empty() && !rows_.empty()) ok = write_plot() && ok;
  fflush(stdout);
  return ok;
}

Progress::Progress(bool enabled, const char* name, const std::vector<size_t>& sizes)
    : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), name_(name), sizes_(sizes) {
  enabled_ = enabled_ || tty_;
  // Small sizes cost latency, not bandwidth: weigh each as at least 256 KiB.
  for (size_t s : sizes_) weight_total_ += std::max<double>(static_cast<double>(s), 256.0 * 1024);
}

void Progress::start(size_t index) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (!started_) {
    t0_ = now;
    started_ = true;
  }
  for (; index_ < index; ++index_) weight_done_ += std::max<double>(static_cast<double>(sizes_[index_]), 256.0 * 1024);
  double elapsed = std::chrono::duration<double>(now - t0_).count();
  char eta[32] = "?";
  if (weight_done_ > 0) {
    long s = std::lround(elapsed / weight_done_ * (weight_total_ - weight_done_));
    snprintf(eta, sizeof eta, "%ld:%02ld", s / 60, s % 60);
  }
  fprintf(stderr, "%s[%s] %zu B (%zu/%zu)  elapsed %.0fs  ETA %s%s", tty_ ? "\r\033[K" : "", name_, sizes_[index],
          index + 1, sizes_.size(), elapsed, eta, tty_ ? "" : "\n");
  fflush(stderr);
}

void Progress::done() {
  if (enabled_ && tty_ && started_) {
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
  }
}

}  // namespace loom::perf
